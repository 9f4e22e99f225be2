-- A webhook worker's task thread, its delivery over, takes the next delivery message straight
-- from the webhook queue's list and claims the delivery's generation in the same step (as take.lua
-- does for jobs): no message is out of the list without its claim's lease, which the reaper
-- (reap_delivery.lua) counts as held, and once the lease runs out with the attempt unrecorded (the
-- thread died) the reaper pushes the message again, as for a message kombu lost.
-- Only a due first-hand message is taken: one carrying an eta (a retry, a hop, a look-again) goes
-- back where it was, as does anything that is not a delivery message, and the take ends: Celery's
-- own consumer then receives it and keeps it until due.
-- A claimed delivery's reads come back with it (look_delivery in common.lua), as the claim of a
-- delivered message does (webhook_claim.lua): the attempt needs no round trip of its own to look.
-- ARGV: now, lease until, ttl (the state's, when the record has no expiry), the job delivery
-- task's name, the batch delivery task's name, the `output`, `completed` and `start` events'
-- names, the job record's field of a `start` message never sent, a message the thread popped
-- itself while it waited (BRPOP) or '' to pop the next one here, and how many messages next in
-- line a claimed take names the keys of (for the thread's next take to declare).
-- KEYS, and ARGV past those: none, or the end of the generation the thread just made, as
-- webhook_record.lua takes them; it is recorded first, whatever the take then finds, so a thread
-- going on to its next delivery spends no round trip on ending the last.
-- The keys the message names (its delivery's state, its record's, the `start` delivery's) and the
-- signing secrets of the owner frozen with the delivery the take asks for in its reply, not by
-- an error, since the record it made stays made; a message it peeked it pops then and hands over
-- with the reply, as if the thread had popped it (BRPOP): asking again for whatever is next in
-- line would race the other threads, who take it meanwhile. The caller takes again with them and
-- the message, recording nothing.
-- Returns {} (the list is empty), {'untaken'} (the message went back), {'!need', message, label,
-- ...}, or
-- {outcome, lease, message, labels of the next messages' keys (one a line)} and, claimed, the
-- look after them: claim_and_look's reply (common.lua) with the message and the labels.
if #KEYS > 0 then record_delivery(KEYS, {unpack(ARGV, 12)}) end

local message = ARGV[10]
local peeked = message == ''
if peeked then  -- popped only once its keys are known to be declared
  message = redis.call('LINDEX', K.webhook_queue, -1)
  if not message then return {} end
end

-- A delivery message's args, ids and event names: what new_id() and the event names are made of.
local ARG = "'([%w_%-%.:]+)'"
local ARGS = '^%[' .. ARG .. ', ' .. ARG .. '%]$'

-- kombu's base64 body (standard alphabet, padded); nil when it is not that. Only for a message
-- whose argsrepr does not say its args (args_of): decoding here cost ~50 us of Redis's time.
local function unbase64(text)
  if #text % 4 ~= 0 then return nil end
  local alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
  local sixbits = {}
  for i = 1, 64 do sixbits[string.byte(alphabet, i)] = i - 1 end
  sixbits[61] = 0  -- '=' pads
  local out = {}
  for i = 1, #text, 4 do
    local a, b, c, d = string.byte(text, i, i + 3)
    if not (sixbits[a] and sixbits[b] and sixbits[c] and sixbits[d]) then return nil end
    local n = ((sixbits[a] * 64 + sixbits[b]) * 64 + sixbits[c]) * 64 + sixbits[d]
    local x, y, z = math.floor(n / 65536), math.floor(n / 256) % 256, n % 256
    if c == 61 then out[#out + 1] = string.char(x)
    elseif d == 61 then out[#out + 1] = string.char(x, y)
    else out[#out + 1] = string.char(x, y, z) end
  end
  return table.concat(out)
end

-- A delivery message's two args (the job's or batch's id, the event): read from its argsrepr,
-- which genq's messages (shared/jobqueue/kombu_layout.py) and Celery's both write as repr(args), when that is
-- two plain quoted words; else from the body itself. nil, nil when neither says.
local function args_of(headers, body)
  local argsrepr = headers['argsrepr']
  if type(argsrepr) == 'string' then
    local id, event = string.match(argsrepr, ARGS)
    if id then return id, event end
  end
  local text = unbase64(body)
  if not text then return nil, nil end
  local parsed, decoded = pcall(cjson.decode, text)
  local args = parsed and type(decoded) == 'table' and decoded[1]
  if type(args) ~= 'table' or type(args[1]) ~= 'string' or type(args[2]) ~= 'string' then return nil, nil end
  return args[1], args[2]
end

-- The delivery a message is for, by its keys' labels: its state, its record, and for a job's
-- `completed` its `start` delivery's state ('' for any other); and its generation. nil when the
-- message is not a due delivery message.
local function delivery_of(raw)
  local ok, decoded = pcall(cjson.decode, raw)
  if not ok or type(decoded) ~= 'table' then return nil end
  local headers, properties = decoded['headers'], decoded['properties']
  if type(headers) ~= 'table' or type(properties) ~= 'table' or type(decoded['body']) ~= 'string' then return nil end
  local task, id, eta = headers['task'], headers['id'], headers['eta']
  if (task ~= ARGV[4] and task ~= ARGV[5]) or type(id) ~= 'string' then return nil end
  if (eta ~= nil and eta ~= cjson.null) or properties['body_encoding'] ~= 'base64' then return nil end
  local generation = tonumber(headers['retries'] or 0)
  if not generation then return nil end
  local owner_id, event = args_of(headers, decoded['body'])
  if not owner_id then return nil end
  if task == ARGV[5] then
    return L.batch_webhook_delivery_key(owner_id, event), L.batch_key(owner_id), '', generation
  end
  local name = event == ARGV[6] and (event .. ':' .. id) or event
  local start = event == ARGV[7] and L.webhook_delivery_key(owner_id, ARGV[8]) or ''
  return L.webhook_delivery_key(owner_id, name), L.job_key(owner_id), start, generation
end

-- Labels of the keys the next ARGV[11] messages in line name, for the thread's next take to declare.
local function next_labels()
  local out = {}
  if ARGV[11] == '0' then return out end  -- LRANGE -0 -1 would read the whole list
  for _, raw in ipairs(redis.call('LRANGE', K.webhook_queue, -tonumber(ARGV[11]), -1)) do
    local delivery, record, start = delivery_of(raw)
    if delivery then
      out[#out + 1] = delivery
      out[#out + 1] = record
      if start ~= '' then out[#out + 1] = start end
    end
  end
  return out
end

local delivery, record, start, generation = delivery_of(message)
if not delivery then
  if not peeked then redis.call('RPUSH', K.webhook_queue, message) end  -- back where the thread popped it
  return {'untaken'}
end
-- The keys only the message names, then the secrets its state names, asked for before the pop.
local absent = missing({delivery, record, start ~= '' and start or nil})
local frozen = nil
if #absent == 0 then
  local secrets
  secrets, frozen = look_labels(key(delivery))
  absent = missing(secrets)
end
if #absent > 0 then
  if peeked then redis.call('RPOP', K.webhook_queue) end
  table.insert(absent, 1, '!need')
  table.insert(absent, 2, message)
  return absent
end
if peeked then redis.call('RPOP', K.webhook_queue) end
local claimed = claim_and_look(key(delivery), key(record), generation, ARGV[1], ARGV[2], ARGV[3],
                               start ~= '' and key(start) or '', ARGV[9], frozen)
table.insert(claimed, 3, message)
table.insert(claimed, 4, table.concat(next_labels(), '\n'))
return claimed
