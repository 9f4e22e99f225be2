-- The reaper checks that a pending webhook delivery can still happen: a claim whose lease has not
-- run out holds it (an attempt is under way), or its last message is in the webhook queue's list
-- or in kombu's unacked hash (a worker took it: with an eta, a worker holds it until due, and
-- kombu itself hands back what a dead worker held). A message found nowhere twice,
-- ORPHAN_RECHECK_S apart (a worker moves a message from the list to the unacked hash in two
-- steps), is pushed again as a copy under a fresh delivery tag (ARGV[3], built by the caller).
-- The copy carries the same generation, so should the original turn up after all (kombu restores
-- a message with other bytes than it took, which LPOS cannot find), the delivery's claim lets
-- only one of the two act, one at a time.
-- KEYS: delivery. ARGV: now, the tag of the message the caller copied, the copy, '1' when the
-- reaper found that tag in the webhook queue's list in one pass over it this period ('' when not:
-- the script looks itself).
-- Returns 'held', 'suspect' (missing once), 'webhook_repushed', 'moved' (a newer message was
-- published meanwhile: checked again soon) or 'stale' (no longer pending).
local delivery, now = KEYS[1], tonumber(ARGV[1])
local rec = redis.call('HMGET', delivery, 'outcome', 'message', 'lease', 'missing_since')
if not rec[2] or (rec[1] and rec[1] ~= 'pending') then
  redis.call('ZREM', K.webhook_pending, delivery)
  return 'stale'
end
local lease = tonumber(rec[3] or '0')
if lease > now then
  redis.call('ZADD', K.webhook_pending, lease + ORPHAN_RECHECK_S, delivery)
  return 'held'
end
local tag = cjson.decode(rec[2])['properties']['delivery_tag']
if tag ~= ARGV[2] then
  redis.call('ZADD', K.webhook_pending, now + ORPHAN_RECHECK_S, delivery)
  return 'moved'
end
-- LPOS from the tail (RANK -1): the older a message, the nearer it is to where kombu takes from.
if ARGV[4] == '1' or redis.call('HEXISTS', K.unacked, tag) == 1 or redis.call('LPOS', K.webhook_queue, rec[2], 'RANK', -1) then
  redis.call('HDEL', delivery, 'missing_since')
  redis.call('ZADD', K.webhook_pending, now + ORPHAN_CHECK_S, delivery)
  return 'held'
end
if not rec[4] then
  redis.call('HSET', delivery, 'missing_since', now)
  redis.call('ZADD', K.webhook_pending, now + ORPHAN_RECHECK_S, delivery)
  return 'suspect'
end
redis.call('HDEL', delivery, 'missing_since')
redis.call('HSET', delivery, 'message', ARGV[3])
redis.call('LPUSH', K.webhook_queue, ARGV[3])
redis.call('ZADD', K.webhook_pending, now + ORPHAN_CHECK_S, delivery)
return 'webhook_repushed'
