-- The reaper checks that a queued job can still be reached: its message is in its queue list or
-- held by a worker (kombu's unacked hash), or, for a follower, its leader is alive. A message
-- found nowhere twice, ORPHAN_RECHECK_S apart (a worker moves a message from the list to the
-- unacked hash in two steps), is pushed again; a follower whose leader is gone leads itself.
-- KEYS: job. ARGV: job id, now, a new message for the job.
-- Returns 'held', 'suspect' (missing once), 'repushed', 'promoted' or 'stale' (not queued).
local job, job_id, now = KEYS[1], ARGV[1], tonumber(ARGV[2])
local rec = redis.call('HMGET', job, 'status', 'follows', 'message', 'queue_key', 'missing_since', 'deadline')
if rec[1] ~= 'queued' or not rec[3] then
  redis.call('ZREM', K.orphan_checks, job_id)
  return 'stale'
end
if rec[2] then
  local leader = redis.call('HGET', job_key(rec[2]), 'status')
  if leader == 'queued' or leader == 'running' then
    redis.call('ZADD', K.orphan_checks, now + ORPHAN_CHECK_S, job_id)
    return 'held'
  end
  redis.call('LREM', followers_key(rec[2]), 0, job_id)
  lead(job, job_id, now)
  return 'promoted'
end
local tag = cjson.decode(rec[3])['properties']['delivery_tag']
if redis.call('HEXISTS', K.unacked, tag) == 1 or redis.call('LPOS', rec[4], rec[3]) then
  redis.call('HDEL', job, 'missing_since')
  redis.call('ZADD', K.orphan_checks, now + ORPHAN_CHECK_S, job_id)
  return 'held'
end
if not rec[5] then
  redis.call('HSET', job, 'missing_since', now)
  redis.call('ZADD', K.orphan_checks, now + ORPHAN_RECHECK_S, job_id)
  return 'suspect'
end
redis.call('HDEL', job, 'missing_since')
enqueue(job, job_id, ARGV[3], rec[4], rec[6], now)
return 'repushed'
