-- A batch whose every line has its result moves on to writing its files. KEYS: batch.
-- ARGV: now. in_progress -> finalizing; any other status is left as it is. Returns 1 when moved.
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'finalizing', 'finalizing_at', ARGV[1])
return 1
