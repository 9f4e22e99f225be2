-- The feeder took lines of a batch's input file into its window. KEYS: batch, window.
-- ARGV: the cursor offset it read from, the new offset, the new line number, '1' when the
-- input is read to its end, the window entries as one JSON array [line, entry, ...], the rows
-- those entries cost (added to the batch's window_rows: what its lines in flight cost the fleet).
-- Returns 1, or 0 (nothing written) when the cursor moved meanwhile: another feeder took these
-- lines (the jobs this one submitted were idempotent replays of that one's).
if redis.call('HGET', KEYS[1], 'cursor_offset') ~= ARGV[1] then return 0 end
local entries = cjson.decode(ARGV[5])
for i = 1, #entries, 1000 do
  redis.call('HSET', KEYS[2], unpack(entries, i, math.min(i + 999, #entries)))
end
if #entries > 0 then redis.call('EXPIRE', KEYS[2], math.max(redis.call('TTL', KEYS[1]), 1)) end
redis.call('HSET', KEYS[1], 'cursor_offset', ARGV[2], 'cursor_line', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'window_rows', ARGV[6])
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'input_done', '1') end
return 1
