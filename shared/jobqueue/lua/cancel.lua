-- A client cancels. KEYS: job. ARGV: owner, now, job id.
-- Returns the record (empty when missing or not the caller's). A canceled leader's followers are
-- not canceled with it: the oldest is promoted to run in its place.
local job, now, job_id = KEYS[1], ARGV[2], ARGV[3]
local rec = redis.call('HMGET', job, 'status', 'owner', 'follows', 'queue', 'cache_key')
if not rec[1] or rec[2] ~= ARGV[1] then return {} end
if rec[1] == 'queued' or rec[1] == 'running' then
  local labels = {}
  expire_labels(labels, job_id, rec[3], rec[4], rec[2], rec[5])
  need(labels)
  if rec[3] then redis.call('LREM', followers_key(rec[3]), 0, job_id) end
  redis.call('HSET', job, 'status', 'canceled', 'completed_at', now,
             'error', '{"type":"canceled","message":"canceled by the client"}')
  if rec[1] == 'running' then redis.call('PUBLISH', CH.cancels, job_id) end
  ended(job, job_id, {status = rec[1], owner = rec[2]})
  promote_followers(job, job_id, now)
end
return redis.call('HGETALL', job)
