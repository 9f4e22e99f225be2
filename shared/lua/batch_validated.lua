-- Validation of a batch's input file ended well. KEYS: batch, its invalid-lines hash.
-- ARGV: now, total requests, the invalid lines as one JSON array [line, entry, line, entry, ...].
-- validating -> in_progress with its total; a batch cancelled meanwhile stays cancelling.
-- Returns 1, or 0 (nothing written) when validation was already recorded or the batch is gone.
local rec = redis.call('HMGET', KEYS[1], 'status', 'validated')
if not rec[1] or rec[2] == '1' then return 0 end
local invalid = cjson.decode(ARGV[3])
for i = 1, #invalid, 1000 do  -- unpack() takes a bounded number of values
  redis.call('HSET', KEYS[2], unpack(invalid, i, math.min(i + 999, #invalid)))
end
if #invalid > 0 then redis.call('EXPIRE', KEYS[2], math.max(redis.call('TTL', KEYS[1]), 1)) end
redis.call('HSET', KEYS[1], 'validated', '1', 'total', ARGV[2])
if rec[1] == 'validating' then
  redis.call('HSET', KEYS[1], 'status', 'in_progress', 'in_progress_at', ARGV[1])
end
return 1
