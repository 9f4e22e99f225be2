-- Accept a job: write its record and enqueue its message, atomically (an outbox in one step).
-- KEYS: job, owner index, queue list, idempotency key ('' for none), in-flight key ('' when the
-- job is not cacheable), cache entry to look up ('' for none), owner's live set.
-- ARGV: job id, score, job ttl, message, idem ttl, idem value, trim-below score, now, known
-- cached output ('' for none), its model label, most live jobs of the owner (0: no bound), most
-- stored bytes of the owner (0: no bound), this job's input bytes, today (days since the epoch),
-- days a record lives, then the record's fields and values (as arguments: decoding them from one
-- JSON argument cost ~15 us of Redis's time per job, packing them ~3 us of the API's in hiredis).
-- The record's owner, deadline, queue and rows (absent: 1) come from the fields about to be
-- written, by name. The owner's live hash counts rows (a job of n samples runs n sequences):
-- a job whose rows would take it past the live bound is refused.
-- Returns {0, idem value} (a replay: nothing written), {1} (queued: enqueued), {2, record...}
-- (a cache hit: succeeded at once), {3, leader id} (a follower: waits for the leader's result),
-- {4, limit name, limit} (the owner is at a bound: nothing written).

local now = ARGV[8]

local function stored_bytes(owner)
  local names = {}
  for day = tonumber(ARGV[14]) - tonumber(ARGV[15]), tonumber(ARGV[14]) do
    names[#names + 1] = owner_bytes_key(owner, day)
  end
  local total = 0
  for _, bytes in ipairs(redis.call('MGET', unpack(names))) do total = total + tonumber(bytes or '0') end
  return total
end

-- Nil when the owner may store this job, else the name of the bound it would pass.
local function over_bound(owner, rows)
  local live_limit, bytes_limit = tonumber(ARGV[11]), tonumber(ARGV[12])
  if live_limit > 0 then
    local held = tonumber(redis.call('HGET', KEYS[7], LIVE_TOTAL) or '0')
    if held + rows > live_limit then return 'live_jobs', live_limit end
  end
  if bytes_limit > 0 and stored_bytes(owner) + tonumber(ARGV[13]) > bytes_limit then
    return 'stored_bytes', bytes_limit
  end
  return nil
end

local function accept(owner, live, rows)
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[7])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  if KEYS[4] ~= '' then redis.call('SET', KEYS[4], ARGV[6], 'EX', ARGV[5]) end
  local bytes_key = owner_bytes_key(owner, ARGV[14])
  redis.call('INCRBY', bytes_key, ARGV[13])
  redis.call('EXPIRE', bytes_key, ARGV[3] + 86400)
  if live then
    redis.call('HSET', KEYS[7], ARGV[1], rows)
    redis.call('HINCRBY', KEYS[7], LIVE_TOTAL, rows)
    redis.call('EXPIRE', KEYS[7], ARGV[3])
  end
end

local function cached_response()
  if ARGV[9] ~= '' or KEYS[6] == '' then return ARGV[9], ARGV[10] end
  local entry = redis.call('HMGET', KEYS[6], 'output', 'model_label')
  return entry[1] or '', entry[2] or ''
end

local function live_leader()
  local leader = redis.call('GET', KEYS[5])
  if not leader then return nil end
  need({L.job_key(leader), L.followers_key(leader)})
  local status = redis.call('HGET', job_key(leader), 'status')
  if status == 'queued' or status == 'running' then return leader end
  return nil
end

if KEYS[4] ~= '' then
  local existing = redis.call('GET', KEYS[4])
  if existing then return {0, existing} end
end
local FIELDS = 16  -- the first field's name in ARGV
-- Taken from the fields about to be written rather than read back from the record after.
local owner, deadline, queue, rows = nil, nil, nil, 1
for i = FIELDS, #ARGV, 2 do
  local name = ARGV[i]
  if name == 'owner' then owner = ARGV[i + 1]
  elseif name == 'deadline' then deadline = ARGV[i + 1]
  elseif name == 'queue' then queue = ARGV[i + 1]
  elseif name == 'rows' then rows = tonumber(ARGV[i + 1]) end
end
local bound, limit = over_bound(owner, rows)
if bound then return {4, bound, limit} end
-- Everything read before the first write: a key the call did not declare is asked for first.
local output, label = cached_response()
local leader = nil
if output == '' and KEYS[5] ~= '' then leader = live_leader() end
need({L.owner_bytes_key(owner, ARGV[14]), L.queued_key(queue or ''), L.webhook_delivery_key(ARGV[1], 'start'),
      L.webhook_delivery_key(ARGV[1], 'completed')})
redis.call('HSET', KEYS[1], unpack(ARGV, FIELDS))
if output ~= '' then
  redis.call('HSET', KEYS[1], 'status', 'succeeded', 'cached', '1', 'output', output, 'model_label', label,
             'metrics', NO_INFERENCE_METRICS, 'started_at', now, 'completed_at', now)
  accept(owner, false, rows)
  push_webhook(KEYS[1], ARGV[1], 'start')
  push_webhook(KEYS[1], ARGV[1], 'completed')
  local record = redis.call('HGETALL', KEYS[1])
  table.insert(record, 1, 2)
  return record
end
if KEYS[5] ~= '' then
  if leader then
    redis.call('HSET', KEYS[1], 'follows', leader, 'message', ARGV[4], 'queue_key', KEYS[3])
    redis.call('RPUSH', followers_key(leader), ARGV[1])
    redis.call('EXPIRE', followers_key(leader), ARGV[3])
    redis.call('ZADD', K.deadlines, deadline, ARGV[1])
    redis.call('ZADD', K.orphan_checks, tonumber(now) + ORPHAN_CHECK_S, ARGV[1])
    accept(owner, true, rows)
    return {3, leader}
  end
  redis.call('SET', KEYS[5], ARGV[1], 'EX', ARGV[3])
end
enqueue(KEYS[1], ARGV[1], ARGV[4], KEYS[3], deadline, now, queue)
accept(owner, true, rows)
return {1}
