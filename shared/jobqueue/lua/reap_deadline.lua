-- The reaper fails a job still queued past its deadline (promptly, not only when a worker
-- happens to receive its message). KEYS: job. ARGV: job id, now, timeout error JSON.
-- Returns 'expired', 'held' (not due: its deadline moved) or 'stale' (not queued any more).
local job, job_id, now = KEYS[1], ARGV[1], ARGV[2]
local rec = redis.call('HMGET', job, 'status', 'deadline', 'follows', 'queue', 'owner', 'cache_key')
if rec[1] ~= 'queued' then
  redis.call('ZREM', K.deadlines, job_id)
  return 'stale'
end
if tonumber(rec[2]) >= tonumber(now) then
  redis.call('ZADD', K.deadlines, rec[2], job_id)
  return 'held'
end
local labels = {}
expire_labels(labels, job_id, rec[3], rec[4], rec[5], rec[6])
need(labels)
expire_queued(job, job_id, ARGV[3], now)
return 'expired'
