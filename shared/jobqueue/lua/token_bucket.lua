-- One API key's token bucket of a kind (api/edge/ratelimit.py); runs on every limited request, so it
-- is loaded without the prelude (it builds no key names).
-- KEYS: bucket. ARGV: capacity, refill per second, cost.
-- Returns {allowed 0/1, tokens left (x1000), ms until full, ms until `cost` tokens are there}.
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity / rate) * 1000) + 1000)
local wait = 0
if tokens < cost then wait = (cost - tokens) / rate end
local full_ms = math.ceil((capacity - tokens) / rate * 1000)
return {allowed, math.floor(tokens * 1000), full_ms, math.ceil(wait * 1000)}
