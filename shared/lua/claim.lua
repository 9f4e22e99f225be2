-- A worker claims a job it received from the broker: a queued one before its deadline, or a
-- running one whose lease lapsed (its worker stopped renewing it: a takeover, which runs even
-- past the queue deadline, since the job was accepted and begun). Past max attempts a lapsed
-- job fails instead (`worker_lost`).
-- KEYS: job. ARGV: worker id, now, lease seconds, timeout error JSON, job id, max attempts,
-- worker-lost error JSON.
-- Returns {outcome, status}: 'claimed' (run it), 'skip' (someone else holds it, it follows a
-- leader, or it is over), 'expired' (its queue deadline passed: failed here), 'exhausted'
-- (lapsed too often: failed here), 'missing'. 'claimed' is followed by the job's record as the
-- claim left it (field, value, ...): the worker needs it to run the job, and reading it here
-- saves a round trip per job.
local job, now, job_id = KEYS[1], ARGV[2], ARGV[5]
local rec = redis.call('HMGET', job, 'status', 'worker', 'lease', 'deadline', 'attempts', 'message', 'follows',
                       'queue', 'webhook_message:start')
local queue = rec[8]
local status = rec[1]
if not status then return {'missing', ''} end
if status == 'running' then
  if rec[2] == ARGV[1] or tonumber(rec[3] or '0') >= tonumber(now) then return {'skip', status} end
  if tonumber(rec[5] or '0') >= tonumber(ARGV[6]) then
    forget_delivery(job)
    fail(job, job_id, ARGV[7], now)
    ended(job, job_id, {status = 'running', queue = queue})
    resolve_followers(job, job_id)
    release_inflight(job, job_id)
    return {'exhausted', 'failed'}
  end
  forget_delivery(job)
elseif status ~= 'queued' or rec[7] then
  return {'skip', status}
elseif tonumber(rec[4]) < tonumber(now) then
  expire_queued(job, job_id, ARGV[4], now)
  return {'expired', 'failed'}
end
local tag = ''
if rec[6] then tag = cjson.decode(rec[6])['properties']['delivery_tag'] end
local lease = tonumber(now) + tonumber(ARGV[3])
-- attempts counts this start: the HINCRBY by 1 folded into the HSET (no script changes it meanwhile).
local attempts = string.format('%d', tonumber(rec[5] or '0') + 1)
redis.call('HSET', job, 'status', 'running', 'worker', ARGV[1], 'started_at', now, 'lease', lease,
           'delivery_tag', tag, 'attempts', attempts)
redis.call('HDEL', job, 'message', 'missing_since')
redis.call('SADD', running_key(job_queue(job, queue)), job_id)
redis.call('ZADD', K.leases, lease, job_id)
leave_queue(job, job_id, queue)
push_webhook(job, job_id, 'start', rec[9])
local reply = {'claimed', status}
for _, item in ipairs(redis.call('HGETALL', job)) do reply[#reply + 1] = item end
return reply
