-- A worker ends the job it holds. KEYS: job, cache entry to write on success ('' for none).
-- ARGV: worker id, job id, cache ttl, fields... Followers of the job get its outcome in the
-- same step. Returns 0 when the worker no longer holds the job (canceled, or handed to another
-- worker after its lease lapsed): nothing is written, so a job ends exactly once.
local job, job_id = KEYS[1], ARGV[2]
local rec = redis.call('HMGET', job, 'status', 'worker')
if rec[1] ~= 'running' or rec[2] ~= ARGV[1] then return 0 end
redis.call('HSET', job, unpack(ARGV, 4))
redis.call('HDEL', job, 'delivery_tag')
ended(job, job_id)
local done = redis.call('HMGET', job, 'status', 'output', 'model_label')
if KEYS[2] ~= '' and done[1] == 'succeeded' then
  redis.call('HSET', KEYS[2], 'output', done[2], 'model_label', done[3] or '')
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
release_inflight(job, job_id)
resolve_followers(job, job_id)
return 1
