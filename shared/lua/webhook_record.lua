-- Ends a webhook delivery's generation (workers/deliveries.py): releases its claim, sets fields,
-- appends to the delivery log; a final outcome also drops the body and takes the delivery out of
-- the reaper's index. KEYS: delivery state, delivery log, pending index, the job's (or batch's)
-- record. ARGV: generation, ttl (the log's, when the record has no expiry), log entry ('' for
-- none), final ('1'/'0'), fields...
if redis.call('HGET', KEYS[1], 'generation') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'lease', '0', unpack(ARGV, 5))
  if ARGV[4] == '1' then
    redis.call('HDEL', KEYS[1], 'body', 'message')
    redis.call('ZREM', KEYS[3], KEYS[1])
  end
end
if ARGV[3] ~= '' then
  redis.call('RPUSH', KEYS[2], ARGV[3])
  local ms = redis.call('PTTL', KEYS[4])  -- the log lives as long as the record
  redis.call('EXPIRE', KEYS[2], ms > 0 and math.ceil(ms / 1000) or ARGV[2])
end
return 1
