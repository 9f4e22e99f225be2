-- A worker ends the job it holds. KEYS: job, cache entry to write on success ('' for none).
-- ARGV: worker id, job id, cache ttl, the url and body of the job's `completed` webhook ('' and ''
-- when the worker built none: the first attempt then builds it), fields... Followers of the job
-- get its outcome in the same step. Returns 0 when the worker no longer holds the job (canceled,
-- or handed to another worker after its lease lapsed): nothing is written, so a job ends exactly
-- once.
local job, job_id = KEYS[1], ARGV[2]
-- Everything read of the record up front, once (the fields written below are the worker's
-- outcome, never these).
local rec = redis.call('HMGET', job, 'status', 'worker', 'queue', 'owner', 'cache_key',
                       'webhook_message:completed', 'delivery_tag')
if rec[1] ~= 'running' or rec[2] ~= ARGV[1] then return 0 end
local labels = {}
ending_labels(labels, job_id, rec[3], rec[4])
if rec[5] then
  labels[#labels + 1] = L.inflight_key(rec[5])
  follower_labels(labels, job_id)
end
need(labels)
-- The broker's record of the message the job was delivered with (kombu's unacked entry) is spent
-- now: a worker that dies before Celery's ack, or whose task thread goes on taking jobs
-- (workers/intake.py), leaves none behind to be delivered again. (A taken job's tag is in none.)
if rec[7] and rec[7] ~= '' then
  redis.call('HDEL', K.unacked, rec[7])
  redis.call('ZREM', K.unacked_index, rec[7])
end
redis.call('HSET', job, unpack(ARGV, 6))
local frozen = ARGV[4] ~= '' and {ARGV[4], ARGV[5], rec[4] or ''} or nil
ended(job, job_id, {status = 'running', queue = rec[3], owner = rec[4], hook = rec[6], frozen = frozen},
      'delivery_tag')
if KEYS[2] ~= '' then
  local done = redis.call('HMGET', job, 'status', 'output', 'model_label')
  if done[1] == 'succeeded' then
    redis.call('HSET', KEYS[2], 'output', done[2], 'model_label', done[3] or '')
    redis.call('EXPIRE', KEYS[2], ARGV[3])
  end
end
-- Only a cacheable job (one with a cache_key) holds its key's in-flight entry or has followers:
-- submit.lua makes a job a leader only when it is given the in-flight key of the job's cache_key,
-- and lead() only for a follower that has one.
if rec[5] then
  release_inflight(job, job_id, rec[5])
  resolve_followers(job, job_id)
end
return 1
