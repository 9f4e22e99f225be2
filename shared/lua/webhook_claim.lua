-- Claims a webhook delivery's generation (workers/deliveries.py).
-- KEYS: delivery state, the job's (or batch's) record. ARGV: generation, now, lease until, ttl
-- (the state's, when the record has no expiry). Returns {outcome, lease}:
-- 'claimed': act for this generation; 'over': the delivery has its outcome; 'stale': a copy of
-- an older generation; 'busy': a copy of the generation another holder's lease still covers (the
-- holder may have died: the copy looks again when that lease ends, instead of being dropped).
local state = redis.call('HMGET', KEYS[1], 'outcome', 'generation', 'lease')
if state[1] and state[1] ~= 'pending' then return {'over', '0'} end
local generation = tonumber(ARGV[1])
local held = tonumber(state[2] or '-1')
local lease = tonumber(state[3] or '0')
local abandoned = generation == held and lease > 0 and lease < tonumber(ARGV[2])
if generation > held or abandoned then
  redis.call('HSET', KEYS[1], 'outcome', 'pending', 'generation', ARGV[1], 'lease', ARGV[3])
  local ms = redis.call('PTTL', KEYS[2])  -- the state lives as long as the record
  redis.call('EXPIRE', KEYS[1], ms > 0 and math.ceil(ms / 1000) or ARGV[4])
  return {'claimed', ARGV[3]}
end
if generation == held and lease > 0 then return {'busy', state[3]} end
return {'stale', '0'}
