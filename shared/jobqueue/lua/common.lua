-- Functions every job-store script shares. The prelude before this file (shared/jobqueue/scripts.py)
-- defines K (the constant keys), CH (the channels), the key functions job_key, followers_key,
-- inflight_key, running_key, queued_key, owner_live_key, owner_bytes_key, the webhook delivery
-- keys and batch_key, which return the keys the call declared, and L, their labels, which the
-- *_labels functions here list for a script to ask for (need) before its first write.

local NO_INFERENCE_METRICS = '{"inference_ms":0}'

-- Push a job's pre-built webhook message for `event` onto the webhook queue, once, and index the
-- delivery as pending: the reaper pushes its message again should the broker lose it
-- (shared/jobqueue/lua/reap_delivery.lua). The delivery's state lives as long as the job record.
-- `message`, optional: the field's value when the caller has read it already (false: absent).
-- `frozen`, optional: {url, body, owner} the caller built for it (the worker that finishes a job
-- builds its `completed` body), stored as a first attempt would freeze them, so no attempt needs
-- a round trip to freeze them (look_delivery).
local function push_webhook(job_key_, job_id, event, message, frozen)
  local field = 'webhook_message:' .. event
  if message == nil then message = redis.call('HGET', job_key_, field) end
  if message then
    redis.call('LPUSH', K.webhook_queue, message)
    redis.call('HDEL', job_key_, field)
    local delivery = webhook_delivery_key(job_id, event)
    if frozen then
      redis.call('HSET', delivery, 'message', message, 'url', frozen[1], 'body', frozen[2], 'owner', frozen[3])
    else
      redis.call('HSET', delivery, 'message', message)
    end
    local ttl = redis.call('PTTL', job_key_)
    if ttl > 0 then redis.call('PEXPIRE', delivery, ttl) end
    redis.call('ZADD', K.webhook_pending, tonumber(redis.call('TIME')[1]) + ORPHAN_CHECK_S, delivery)
  end
end

-- The record's queue field ('' when absent). `queue`, optional: its value when the caller has read
-- it already (false: absent), which saves reading it again.
local function job_queue(job_key_, queue)
  if queue == nil then queue = redis.call('HGET', job_key_, 'queue') end
  return queue or ''
end

-- Forget the broker's copy of the message a job was claimed with (kombu's unacked entry), so a
-- job handed back by the store is never also restored by the broker's visibility timeout.
local function forget_delivery(job_key_)
  local tag = redis.call('HGET', job_key_, 'delivery_tag')
  if tag and tag ~= '' then
    redis.call('HDEL', K.unacked, tag)
    redis.call('ZREM', K.unacked_index, tag)
    redis.call('HDEL', job_key_, 'delivery_tag')
  end
end

-- The job is no longer waiting for a worker: out of its queue's index and the reaper's.
-- `queue`: as job_queue's.
local function leave_queue(job_key_, job_id, queue)
  redis.call('ZREM', queued_key(job_queue(job_key_, queue)), job_id)
  redis.call('ZREM', K.deadlines, job_id)
  redis.call('ZREM', K.orphan_checks, job_id)
end

-- The job's indexes while it runs: out of the running set and the lease index. `queue`: as
-- job_queue's.
local function leave_running_indexes(job_key_, job_id, queue)
  redis.call('SREM', running_key(job_queue(job_key_, queue)), job_id)
  redis.call('ZREM', K.leases, job_id)
end

-- The job no longer runs: out of the running set and the lease index.
local function leave_running(job_key_, job_id)
  leave_running_indexes(job_key_, job_id)
  redis.call('HDEL', job_key_, 'lease')
end

-- The job no longer counts against its owner's live-job bound: out of the owner's live hash,
-- its rows off the hash's total (LIVE_TOTAL).
local function leave_live(live_key, job_id)
  local rows = redis.call('HGET', live_key, job_id)
  if rows then
    redis.call('HDEL', live_key, job_id)
    redis.call('HINCRBY', live_key, LIVE_TOTAL, -tonumber(rows))
  end
end

-- Bookkeeping of every move to a terminal status (the caller has set the status and fields).
-- `known`, optional: what the caller read of the record before its own writes, which saves
-- reading it again: {status = the status it ended from, queue = , owner = , hook = the
-- webhook_message:completed field} (a field absent from the record as false), and `frozen`, the
-- `completed` delivery's url, body and owner when the caller built them (push_webhook). A job
-- that ended from running left its queue's and the reaper's queued indexes when it was claimed
-- (claim.lua; only enqueue adds to them, and only for a queued job), so only a job ended from
-- another status (queued, or unknown) leaves them here. `drop`, optional: one more record field
-- the caller deletes with the rest, in the same HDEL.
local function ended(job_key_, job_id, known, drop)
  known = known or {}
  local queue = job_queue(job_key_, known.queue)
  if known.status ~= 'running' then leave_queue(job_key_, job_id, queue) end
  leave_running_indexes(job_key_, job_id, queue)
  if drop then
    redis.call('HDEL', job_key_, 'lease', 'message', 'queue_key', 'missing_since', drop)
  else
    redis.call('HDEL', job_key_, 'lease', 'message', 'queue_key', 'missing_since')
  end
  local owner = known.owner
  if owner == nil then owner = redis.call('HGET', job_key_, 'owner') end
  if owner then leave_live(owner_live_key(owner), job_id) end
  redis.call('PUBLISH', CH.job_events, job_id)
  push_webhook(job_key_, job_id, 'completed', known.hook, known.frozen)
end

-- Put a job (back) in the queue: its message onto the broker's list, its deadline and its next
-- orphan check into the reaper's indexes. The message stays in the record until a claim, so
-- the reaper can tell whether the broker still holds it.
-- `queue`, optional: the record's queue field when the caller has it (submit.lua wrote it).
local function enqueue(job_key_, job_id, message, queue_list, deadline, now, queue)
  redis.call('HSET', job_key_, 'status', 'queued', 'message', message, 'queue_key', queue_list,
             'deadline', deadline)
  redis.call('LPUSH', queue_list, message)
  if queue == nil then queue = redis.call('HGET', job_key_, 'queue') end
  redis.call('ZADD', queued_key(queue), now, job_id)
  redis.call('ZADD', K.deadlines, deadline, job_id)
  redis.call('ZADD', K.orphan_checks, tonumber(now) + ORPHAN_CHECK_S, job_id)
end

local function fail(job_key_, job_id, error_json, now)
  redis.call('HSET', job_key_, 'status', 'failed', 'error', error_json, 'completed_at', now)
end

-- Labels of the keys ended() touches for job `job_id`, whose record's queue and owner fields
-- are `queue` and `owner` (false: absent), appended to `out`.
local function ending_labels(out, job_id, queue, owner)
  out[#out + 1] = L.queued_key(queue or '')
  out[#out + 1] = L.running_key(queue or '')
  if owner then out[#out + 1] = L.owner_live_key(owner) end
  out[#out + 1] = L.webhook_delivery_key(job_id, 'completed')
end

-- Coalescing (docs/cache.md). A cacheable job that finds no job in flight for its cache key
-- becomes the leader (K inflight key names it); identical submissions meanwhile become
-- followers, listed under the leader. The scripts that end the leader resolve its followers:
-- its result or failure is copied into each one still queued; when the leader is canceled or
-- expires in the queue, the oldest follower is promoted (its own message goes onto its queue)
-- and the rest follow it.
-- `cache_key`, optional: the leader's cache_key field when the caller has read it (false: absent).
local function release_inflight(leader_key, leader_id, cache_key)
  if cache_key == nil then cache_key = redis.call('HGET', leader_key, 'cache_key') end
  if cache_key and redis.call('GET', inflight_key(cache_key)) == leader_id then
    redis.call('DEL', inflight_key(cache_key))
  end
end

-- The leader's outcome is read only when it has a follower still queued (resolving followers
-- writes their records, never the leader's).
local function resolve_followers(leader_key, leader_id)
  local list = followers_key(leader_id)
  local r = nil
  for _, id in ipairs(redis.call('LRANGE', list, 0, -1)) do
    local follower = job_key(id)
    if redis.call('HGET', follower, 'status') == 'queued' then
      r = r or redis.call('HMGET', leader_key, 'status', 'output', 'error', 'model_label', 'completed_at')
      redis.call('HSET', follower, 'status', r[1], 'model_label', r[4] or '', 'started_at', r[5],
                 'completed_at', r[5])
      if r[1] == 'succeeded' then
        redis.call('HSET', follower, 'output', r[2], 'cached', '1', 'metrics', NO_INFERENCE_METRICS)
      else
        redis.call('HSET', follower, 'error', r[3] or '')
      end
      push_webhook(follower, id, 'start')
      ended(follower, id)
    end
  end
  redis.call('DEL', list)
end

-- Make a queued follower a leader of its own: its own message goes onto its queue.
local function lead(job, id, now)
  local rec = redis.call('HMGET', job, 'message', 'queue_key', 'cache_key', 'deadline')
  local ttl = math.max(redis.call('TTL', job), 1)
  redis.call('HDEL', job, 'follows')
  enqueue(job, id, rec[1], key(L.key(rec[2])), rec[4], now)
  if rec[3] then redis.call('SET', inflight_key(rec[3]), id, 'NX', 'EX', ttl) end
  redis.call('EXPIRE', followers_key(id), ttl)
end

local function promote_followers(leader_key, leader_id, now)
  local list = followers_key(leader_id)
  local ids = redis.call('LRANGE', list, 0, -1)
  redis.call('DEL', list)
  release_inflight(leader_key, leader_id)
  local leader = nil
  for _, id in ipairs(ids) do
    local follower = job_key(id)
    local rec = redis.call('HMGET', follower, 'status', 'message')
    if rec[1] == 'queued' and rec[2] then
      if leader == nil then
        leader = id
        lead(follower, id, now)
      else
        redis.call('HSET', follower, 'follows', leader)
        redis.call('RPUSH', followers_key(leader), id)
      end
    end
  end
end

-- Labels of the keys lead() touches for follower `id`, whose record's queue_key, queue and
-- cache_key fields are given (false: absent).
local function lead_labels(out, id, queue_list, queue, cache_key)
  if queue_list then out[#out + 1] = L.key(queue_list) end
  out[#out + 1] = L.queued_key(queue or '')
  if cache_key then out[#out + 1] = L.inflight_key(cache_key) end
  out[#out + 1] = L.followers_key(id)
end

-- Labels of the keys resolve_followers and promote_followers touch for leader `leader_id`, read
-- as far as the call's keys allow: its followers list, then each follower's record (both leave
-- a follower that is not queued alone). What it cannot read yet it lists, unread: the next
-- round, with those keys, reads on.
local function follower_labels(out, leader_id)
  local list = L.followers_key(leader_id)
  out[#out + 1] = list
  if #missing({list}) > 0 then return end
  local ids = redis.call('LRANGE', key(list), 0, -1)
  local records = {}
  for _, id in ipairs(ids) do
    records[#records + 1] = L.job_key(id)
    out[#out + 1] = L.job_key(id)
  end
  if #missing(records) > 0 then return end
  for _, id in ipairs(ids) do
    local rec = redis.call('HMGET', job_key(id), 'status', 'queue', 'owner', 'queue_key', 'cache_key')
    if rec[1] == 'queued' then
      ending_labels(out, id, rec[2], rec[3])
      out[#out + 1] = L.webhook_delivery_key(id, 'start')
      lead_labels(out, id, rec[4], rec[2], rec[5])
    end
  end
end

-- A queued job that will never run: failed (timeout), its followers promoted; a follower also
-- leaves its leader's list.
local function expire_queued(job_key_, job_id, error_json, now)
  local leader = redis.call('HGET', job_key_, 'follows')
  if leader then redis.call('LREM', followers_key(leader), 0, job_id) end
  fail(job_key_, job_id, error_json, now)
  ended(job_key_, job_id)
  promote_followers(job_key_, job_id, now)
end

-- Labels of the keys expire_queued touches for job `job_id` (its record's follows, queue, owner
-- and cache_key fields given; false: absent).
local function expire_labels(out, job_id, follows, queue, owner, cache_key)
  if follows then out[#out + 1] = L.followers_key(follows) end
  ending_labels(out, job_id, queue, owner)
  follower_labels(out, job_id)
  if cache_key then out[#out + 1] = L.inflight_key(cache_key) end
end

-- A task message's (kombu's JSON envelope's) string field `name` at or after `from`, by a pattern,
-- when its value is a plain word, as its task name, id and delivery tag are in every message genq
-- (shared/jobqueue/kombu_layout.py) and Celery write, in either's JSON spacing; nil otherwise, and the caller
-- decodes the whole envelope, which cost ~10 us more of Redis's time each time.
local function word_field(message, name, from)
  -- A plain find (a memory search) for the name, then a pattern anchored there: a pattern searched
  -- through the whole message cost several times more.
  local at = string.find(message, '"' .. name .. '":', from or 1, true)
  return at and string.match(message, '^%s*"([%w_%.%-]+)"[,}]', at + #name + 3)
end

-- The delivery tag of a task message, in its `properties`.
local function delivery_tag(message)
  local properties = string.find(message, '"properties":', 1, true)
  local tag = properties and word_field(message, 'delivery_tag', properties)
  if tag then return tag end
  return cjson.decode(message)['properties']['delivery_tag']
end

-- Claiming a job for worker `worker` (claim.lua: a delivered message; take.lua: one it takes from
-- its queue list itself), in two steps: claim_plan reads the record and decides, writing nothing,
-- and lists the keys claim_apply will touch (beyond the record and the constants), so that a
-- script asks for them before its first write. A queued job before its deadline is claimed, and
-- so is a running one whose lease lapsed (its worker stopped renewing it: a takeover, which runs
-- even past the queue deadline, since the job was accepted and begun). Past max attempts a lapsed
-- job fails instead (`worker_lost`). `c` holds now, lease_s, timeout_error, max_attempts and
-- lost_error.
-- The plan: {outcome = 'claim' | 'takeover' | 'exhausted' | 'expired' | 'skip' | 'missing',
-- status = the record's, rec = what it read, labels = the keys it needs}.
local function claim_plan(job, job_id, worker, c)
  local rec = redis.call('HMGET', job, 'status', 'worker', 'lease', 'deadline', 'attempts', 'message', 'follows',
                         'queue', 'webhook_message:start', 'owner', 'cache_key')
  local status, now = rec[1], tonumber(c.now)
  local plan = {status = status or '', rec = rec, labels = {}}
  if not status then plan.outcome = 'missing'
  elseif status == 'running' then
    if rec[2] == worker or tonumber(rec[3] or '0') >= now then plan.outcome = 'skip'
    elseif tonumber(rec[5] or '0') >= tonumber(c.max_attempts) then plan.outcome = 'exhausted'
    else plan.outcome = 'takeover' end
  elseif status ~= 'queued' or rec[7] then plan.outcome = 'skip'
  elseif tonumber(rec[4]) < now then plan.outcome = 'expired'
  else plan.outcome = 'claim' end
  local out = plan.labels
  if plan.outcome == 'claim' or plan.outcome == 'takeover' then
    out[1], out[2] = L.queued_key(rec[8] or ''), L.running_key(rec[8] or '')
    if rec[9] then out[3] = L.webhook_delivery_key(job_id, 'start') end
  elseif plan.outcome == 'exhausted' or plan.outcome == 'expired' then
    expire_labels(out, job_id, false, rec[8], rec[10], rec[11])
  end
  return plan
end

-- Carries out a claim_plan. Returns outcome, status: 'claimed' (run it), 'skip' (someone else
-- holds it, it follows a leader, or it is over), 'expired' (its queue deadline passed: failed
-- here), 'exhausted' (lapsed too often: failed here), 'missing'.
local function claim_apply(job, job_id, worker, c, plan)
  local rec, outcome, now = plan.rec, plan.outcome, c.now
  local queue = rec[8]
  if outcome == 'missing' or outcome == 'skip' then return outcome, plan.status end
  if outcome == 'exhausted' then
    forget_delivery(job)
    fail(job, job_id, c.lost_error, now)
    ended(job, job_id, {status = 'running', queue = queue, owner = rec[10]})
    resolve_followers(job, job_id)
    release_inflight(job, job_id, rec[11])
    return 'exhausted', 'failed'
  end
  if outcome == 'expired' then
    expire_queued(job, job_id, c.timeout_error, now)
    return 'expired', 'failed'
  end
  if outcome == 'takeover' then forget_delivery(job) end
  local tag = ''
  if rec[6] then tag = delivery_tag(rec[6]) end
  local lease = tonumber(now) + tonumber(c.lease_s)
  -- attempts counts this start: the HINCRBY by 1 folded into the HSET (no script changes it meanwhile).
  local attempts = string.format('%d', tonumber(rec[5] or '0') + 1)
  redis.call('HSET', job, 'status', 'running', 'worker', worker, 'started_at', now, 'lease', lease,
             'delivery_tag', tag, 'attempts', attempts)
  redis.call('HDEL', job, 'message', 'missing_since')
  redis.call('SADD', running_key(job_queue(job, queue)), job_id)
  redis.call('ZADD', K.leases, lease, job_id)
  leave_queue(job, job_id, queue)
  push_webhook(job, job_id, 'start', rec[9])
  return 'claimed', plan.status
end

-- Claim generation `generation` of a webhook delivery (webhook_claim.lua: a delivered message;
-- webhook_take.lua: one a task thread took from the list itself). `record`: the job's (or
-- batch's) record, whose expiry the state takes. Returns outcome, lease:
-- 'claimed': act for this generation; 'over': the delivery has its outcome; 'stale': a copy of
-- an older generation; 'busy': a copy of the generation another holder's lease still covers (the
-- holder may have died: the copy looks again when that lease ends, instead of being dropped).
local function claim_delivery(delivery, record, generation, now, lease_until, ttl)
  local state = redis.call('HMGET', delivery, 'outcome', 'generation', 'lease')
  if state[1] and state[1] ~= 'pending' then return 'over', '0' end
  generation = tonumber(generation)
  local held = tonumber(state[2] or '-1')
  local lease = tonumber(state[3] or '0')
  local abandoned = generation == held and lease > 0 and lease < tonumber(now)
  if generation > held or abandoned then
    redis.call('HSET', delivery, 'outcome', 'pending', 'generation', string.format('%d', generation),
               'lease', lease_until)
    local ms = redis.call('PTTL', record)  -- the state lives as long as the record
    redis.call('EXPIRE', delivery, ms > 0 and math.ceil(ms / 1000) or ttl)
    return 'claimed', lease_until
  end
  if generation == held and lease > 0 then return 'busy', state[3] end
  return 'stale', '0'
end

-- What an attempt of a claimed delivery reads (workers/deliveries.py `snapshot_of` says what each part
-- means): the url, body and owner frozen for it (by an earlier attempt, or by the worker that
-- finished the job), the job's (or batch's) record, and for a job's `completed` (`start_delivery`
-- is that job's `start` delivery state; '' for any other delivery) whether the record still holds
-- its `start` message (`start_field`: never sent) and the `start` delivery's outcome and next
-- attempt. With a body frozen, the attempt is counted here and the owner's signing keys read, so
-- the attempt needs no round trip of its own before it sends: {the attempt's number, the current
-- and previous secrets} (a wait that makes no attempt sets the count back in its ending).
-- `frozen`, optional: the delivery's url, body and owner when the caller read them (look_labels).
local function look_delivery(delivery, record, start_delivery, start_field, frozen)
  frozen = frozen or redis.call('HMGET', delivery, 'url', 'body', 'owner')
  -- An attempt that sends a frozen body reads only the job's input of its record (the webhook
  -- filter, whether `completed` waits for `start`): the whole record, ~20 fields, went through
  -- Lua and the reply for nothing. A first attempt builds its body from the whole record.
  local read = {}
  if not (frozen[1] and frozen[2]) then
    read = redis.call('HGETALL', record)
  else
    local input = redis.call('HGET', record, 'input')
    if input then read = {'input', input} end
  end
  local seen = {frozen, read, false, false, false}
  if start_delivery ~= '' then
    seen[3] = redis.call('HEXISTS', record, start_field)
    seen[4] = redis.call('HMGET', start_delivery, 'outcome', 'next_at')
  end
  if frozen[1] and frozen[2] then
    local owner = frozen[3] or ''
    seen[5] = {redis.call('HINCRBY', delivery, 'attempts', 1),
               redis.call('MGET', webhook_secret_key(owner), webhook_previous_secret_key(owner))}
  end
  return seen
end

-- Labels of the keys look_delivery reads beyond the delivery and its record: with a frozen url
-- and body, the signing secrets of the owner frozen with them; and what it read (url, body,
-- owner), for look_delivery (a claim writes none of those).
local function look_labels(delivery)
  local frozen = redis.call('HMGET', delivery, 'url', 'body', 'owner')
  if not (frozen[1] and frozen[2]) then return {}, frozen end
  local owner = frozen[3] or ''
  return {L.webhook_secret_key(owner), L.webhook_previous_secret_key(owner)}, frozen
end

-- claim_delivery's outcome and lease, then look_delivery's reads when the claim was made.
-- `frozen`: as look_delivery's.
local function claim_and_look(delivery, record, generation, now, lease_until, ttl, start_delivery, start_field,
                              frozen)
  local outcome, lease = claim_delivery(delivery, record, generation, now, lease_until, ttl)
  if outcome ~= 'claimed' then return {outcome, lease} end
  return {outcome, lease, look_delivery(delivery, record, start_delivery, start_field, frozen)}
end

-- Ends a webhook delivery's generation (webhook_record.lua: a delivered message's; webhook_take.lua:
-- the one its thread just made, in the take's call): releases its claim, sets fields, appends to
-- the delivery log; a final outcome also drops the body and takes the delivery out of the
-- reaper's index. `at`: the delivery state, the delivery log, the pending index, the job's (or
-- batch's) record. `args`: generation, ttl (the log's, when the record has no expiry), log entry
-- ('' for none), final ('1'/'0'), then the fields as name, value...
local function record_delivery(at, args)
  if redis.call('HGET', at[1], 'generation') == args[1] then
    redis.call('HSET', at[1], 'lease', '0', unpack(args, 5))
    if args[4] == '1' then
      redis.call('HDEL', at[1], 'body', 'message')
      redis.call('ZREM', at[3], at[1])
    end
  end
  if args[3] ~= '' then
    redis.call('RPUSH', at[2], args[3])
    local ms = redis.call('PTTL', at[4])  -- the log lives as long as the record
    redis.call('EXPIRE', at[2], ms > 0 and math.ceil(ms / 1000) or args[2])
  end
end
