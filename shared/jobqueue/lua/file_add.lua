-- A file is stored: its record joins the owner's files and its bytes count against the owner's
-- file quota, unless they would pass it. KEYS: file, owner's files, owner's file bytes, expiring
-- files. ARGV: the file's bytes, the owner's quota in bytes (0: none), index score, expires_at
-- (0: never), then the record's fields as name, value pairs.
-- Returns 1, or 0 (nothing written) when the file would take the owner past its quota.
local size, quota = tonumber(ARGV[1]), tonumber(ARGV[2])
local held = tonumber(redis.call('GET', KEYS[3]) or '0')
if quota > 0 and held + size > quota then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('ZADD', KEYS[2], ARGV[3], redis.call('HGET', KEYS[1], 'id'))
redis.call('INCRBY', KEYS[3], size)
if tonumber(ARGV[4]) > 0 then redis.call('ZADD', KEYS[4], ARGV[4], redis.call('HGET', KEYS[1], 'id')) end
return 1
