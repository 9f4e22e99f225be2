-- Validation of a batch's input file ended well. KEYS: batch, its owner's file bytes.
-- ARGV: now, total requests, how many lines repeat a custom_id (their numbers are in storage),
-- the bytes validation wrote to storage beside the batch for the feeder: they count against the
-- owner's file quota (kept as the batch's kept_bytes, released by batch_finish.lua).
-- validating -> in_progress with its total; a batch cancelled meanwhile stays cancelling.
-- Returns 1, or 0 (nothing written) when validation was already recorded or the batch is gone.
local rec = redis.call('HMGET', KEYS[1], 'status', 'validated')
if not rec[1] or rec[2] == '1' then return 0 end
redis.call('HSET', KEYS[1], 'validated', '1', 'total', ARGV[2], 'duplicates', ARGV[3])
if tonumber(ARGV[4]) > 0 then
  redis.call('HSET', KEYS[1], 'kept_bytes', ARGV[4])
  redis.call('INCRBY', KEYS[2], ARGV[4])
end
if rec[1] == 'validating' then
  redis.call('HSET', KEYS[1], 'status', 'in_progress', 'in_progress_at', ARGV[1])
end
return 1
