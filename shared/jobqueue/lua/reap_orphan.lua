-- The reaper checks that a queued job can still be reached: its message is in its queue list, or
-- held by a worker (kombu's unacked hash) that took it less than UNACKED_STALE_S ago, or, for a
-- follower, its leader is alive. A message found nowhere twice, ORPHAN_RECHECK_S apart (a worker
-- moves a message from the list to the unacked hash in two steps), is pushed again. So is one a
-- worker has held that long without claiming it: a worker runs what it takes at once, so its
-- holder died (e.g. it took the job's hand-back message just before its engine's death ended
-- it); its unacked entry is dropped so that the broker never hands it out as well, and were the
-- holder alive after all, the job's claim makes the second copy harmless. A follower whose
-- leader is gone leads itself.
-- KEYS: job. ARGV: job id, now, a new message for the job, '1' when the reaper found its message in
-- its queue list in one pass over the list this period ('' when not: the script looks itself).
-- Returns 'held', 'suspect' (missing once), 'repushed', 'promoted' or 'stale' (not queued).
local job, job_id, now = KEYS[1], ARGV[1], tonumber(ARGV[2])
local rec = redis.call('HMGET', job, 'status', 'follows', 'message', 'queue_key', 'missing_since', 'deadline',
                       'queue', 'cache_key')
if rec[1] ~= 'queued' or not rec[3] then
  redis.call('ZREM', K.orphan_checks, job_id)
  return 'stale'
end
if rec[2] then
  local labels = {L.job_key(rec[2]), L.followers_key(rec[2])}
  lead_labels(labels, job_id, rec[4], rec[7], rec[8])
  need(labels)
  local leader = redis.call('HGET', job_key(rec[2]), 'status')
  if leader == 'queued' or leader == 'running' then
    redis.call('ZADD', K.orphan_checks, now + ORPHAN_CHECK_S, job_id)
    return 'held'
  end
  redis.call('LREM', followers_key(rec[2]), 0, job_id)
  lead(job, job_id, now)
  return 'promoted'
end
need({L.key(rec[4]), L.queued_key(rec[7] or '')})
local queue_list = key(L.key(rec[4]))
local tag = cjson.decode(rec[3])['properties']['delivery_tag']
local taken_at = tonumber(redis.call('ZSCORE', K.unacked_index, tag) or '0')
local held = taken_at > 0 and now - taken_at < UNACKED_STALE_S
-- RANK -1 scans from the tail, where kombu takes messages: one queued an ORPHAN_CHECK_S or more
-- is nearer that end than the head, where new ones go in.
local listed = taken_at == 0 and (ARGV[4] == '1' or redis.call('LPOS', queue_list, rec[3], 'RANK', -1))
if held or listed then
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
if taken_at > 0 then
  redis.call('HDEL', K.unacked, tag)
  redis.call('ZREM', K.unacked_index, tag)
end
enqueue(job, job_id, ARGV[3], queue_list, rec[6], now)
return 'repushed'
