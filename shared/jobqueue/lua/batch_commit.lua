-- Finished lines of a batch were written to storage as one part. KEYS: batch, window, parts.
-- ARGV: the part number the writer expected, the part's storage name, lines completed, lines
-- failed, the rows those lines cost, then the line numbers. They leave the window (and its
-- window_rows) and count in the same step, so each line's result is in exactly one committed part.
-- Returns 1, or 0 (nothing written) when another writer committed that part number first.
if redis.call('HGET', KEYS[1], 'part_seq') ~= ARGV[1] then return 0 end
for i = 6, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
-- Never below zero: a window filled before its rows were counted.
local rows = tonumber(redis.call('HGET', KEYS[1], 'window_rows') or '0') - tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'window_rows', math.max(rows, 0))
redis.call('HINCRBY', KEYS[1], 'completed', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'failed', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'part_seq', 1)
redis.call('RPUSH', KEYS[3], ARGV[2])
redis.call('EXPIRE', KEYS[3], math.max(redis.call('TTL', KEYS[1]), 1))
return 1
