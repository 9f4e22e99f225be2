-- The reaper hands back a running job whose lease lapsed (its worker died, hung, or dropped it
-- without ending it): queued again with a fresh deadline and a new message, or, once it has
-- been started max-attempts times, failed (`worker_lost`).
-- KEYS: job. ARGV: job id, now, max attempts, message, queue list, new deadline, error JSON.
-- Returns 'requeued', 'failed', 'held' (renewed meanwhile) or 'stale' (not running any more).
local job, job_id, now = KEYS[1], ARGV[1], ARGV[2]
local rec = redis.call('HMGET', job, 'status', 'lease', 'attempts', 'queue', 'owner', 'cache_key')
if rec[1] ~= 'running' then
  redis.call('ZREM', K.leases, job_id)
  return 'stale'
end
if tonumber(rec[2] or '0') >= tonumber(now) then return 'held' end
local exhausted = tonumber(rec[3] or '0') >= tonumber(ARGV[3])
local labels = {}
if exhausted then
  expire_labels(labels, job_id, false, rec[4], rec[5], rec[6])
else
  labels = {L.running_key(rec[4] or ''), L.queued_key(rec[4] or ''), L.key(ARGV[5])}
end
need(labels)
forget_delivery(job)
if exhausted then
  fail(job, job_id, ARGV[7], now)
  ended(job, job_id, {status = 'running', queue = rec[4], owner = rec[5]})
  release_inflight(job, job_id, rec[6])
  resolve_followers(job, job_id)
  return 'failed'
end
leave_running(job, job_id)
redis.call('HSET', job, 'worker', '')
redis.call('HDEL', job, 'started_at')
enqueue(job, job_id, ARGV[4], key(L.key(ARGV[5])), ARGV[6], now)
return 'requeued'
