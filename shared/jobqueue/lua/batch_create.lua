-- A client creates a batch. KEYS: batch, owner's batches, active batches, owner's active
-- batches. ARGV: batch id, its fields as a JSON array [field, value, ...], its TTL (s), its
-- score in the owner's list, its creation time, now, the owner's most active batches, the time
-- its record lapses (its score among the owner's active batches).
-- The owner's active batches are counted and the new one joins them in one step, so two creates
-- at once cannot both take the last slot; one whose record lapsed without an end no longer
-- counts. Returns 1, or 0 (nothing written) when the owner is at the bound.
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[6])
if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[7]) then return 0 end
redis.call('HSET', KEYS[1], unpack(cjson.decode(ARGV[2])))
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[8], ARGV[1])
redis.call('EXPIRE', KEYS[4], ARGV[3])
return 1
