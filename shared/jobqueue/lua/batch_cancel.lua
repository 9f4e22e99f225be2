-- A client cancels a batch. KEYS: batch. ARGV: owner, now.
-- Returns the record (empty when missing or not the caller's). A validating or in_progress batch
-- moves to cancelling (the feeder then cancels its lines in flight and ends it cancelled); any
-- other status is left as it is.
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner')
if not rec[1] or rec[2] ~= ARGV[1] then return {} end
if rec[1] == 'validating' or rec[1] == 'in_progress' then
  redis.call('HSET', KEYS[1], 'status', 'cancelling', 'cancelling_at', ARGV[2])
end
return redis.call('HGETALL', KEYS[1])
