-- A batch ends. KEYS: batch, active batches, window, owner's active batches, parts, output
-- file, error file, owner's files. ARGV: final status, now, errors JSON ('' for none), output
-- file fields as a JSON array ('' for none), error file fields likewise, files' index score,
-- files' expires_at (0: none), the batch webhook's delivery message ('' for none). Declared: the
-- owner's file bytes, the batch webhook's delivery state.
-- The batch's files become the owner's, its webhook is enqueued, it leaves the feeder's set and
-- frees its owner's slot in one step: the batch.<status> event is sent once, never lost. The
-- bytes validation kept beside it (kept_bytes: the caller deleted those files) stop counting
-- against the owner's file quota.
-- Returns 1, or 0 (nothing written) when the batch is gone or already ended.
local TERMINAL = {completed = true, failed = true, expired = true, cancelled = true}
local rec = redis.call('HMGET', KEYS[1], 'status', 'id', 'owner')
if not rec[1] or TERMINAL[rec[1]] then return 0 end
need({L.owner_file_bytes_key(rec[3] or ''), L.batch_webhook_delivery_key(rec[2], 'batch.' .. ARGV[1])})
local function add_file(key, fields_json, field)
  if fields_json == '' then return end
  local fields = cjson.decode(fields_json)
  redis.call('HSET', key, unpack(fields))
  local id = redis.call('HGET', key, 'id')
  -- An expiring file is the file sweep's to delete, content and record together.
  if tonumber(ARGV[7]) > 0 then redis.call('ZADD', K.files_expiring, ARGV[7], id) end
  -- Written whatever the owner's file quota (the batch's results), but counted against it.
  local owner = redis.call('HGET', KEYS[1], 'owner')
  redis.call('INCRBY', owner_file_bytes_key(owner), redis.call('HGET', key, 'bytes'))
  redis.call('ZADD', KEYS[8], ARGV[6], id)
  redis.call('HSET', KEYS[1], field, id)
end
add_file(KEYS[6], ARGV[4], 'output_file_id')
add_file(KEYS[7], ARGV[5], 'error_file_id')
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'errors', ARGV[3]) end
redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[2])
if ARGV[8] ~= '' then
  -- Indexed as pending like a job's deliveries: the reaper pushes it again should the broker lose it.
  redis.call('LPUSH', K.webhook_queue, ARGV[8])
  local delivery = batch_webhook_delivery_key(rec[2], 'batch.' .. ARGV[1])
  redis.call('HSET', delivery, 'message', ARGV[8])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', delivery, ttl) end
  redis.call('ZADD', K.webhook_pending, tonumber(ARGV[2]) + ORPHAN_CHECK_S, delivery)
end
local kept = tonumber(redis.call('HGET', KEYS[1], 'kept_bytes') or '0')
if kept > 0 then
  local held = owner_file_bytes_key(redis.call('HGET', KEYS[1], 'owner'))
  if redis.call('DECRBY', held, kept) <= 0 then redis.call('DEL', held) end
end
redis.call('ZREM', KEYS[2], rec[2])
redis.call('ZREM', KEYS[4], rec[2])
redis.call('DEL', KEYS[3], KEYS[5])
return 1
