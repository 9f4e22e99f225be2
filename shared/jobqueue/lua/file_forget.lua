-- A file is deleted or has expired (its content is deleted from storage by the caller): its
-- record goes, it leaves the owner's files and the expiring files, and its bytes no longer count
-- against the owner's quota. KEYS: file, owner's files, owner's file bytes, expiring files.
-- ARGV: the file's id.
-- Returns 1, or 0 (only the index entries removed) when the record was already gone: its bytes
-- are released once, however many callers forget it.
local size = redis.call('HGET', KEYS[1], 'bytes')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if not size then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('DECRBY', KEYS[3], size) <= 0 then redis.call('DEL', KEYS[3]) end
return 1
