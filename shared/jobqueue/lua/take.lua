-- A worker's task thread, its job over, takes the next queued job straight from the broker's
-- lists and claims it in the same step: no message is ever out of the list without its job
-- claimed (and so covered by the job's lease and the lease reaper). The order is the broker's:
-- KEYS are the lists in the order the worker's BRPOP names them (priority 0 first), and each is
-- popped at the end BRPOP pops. A message whose job cannot be claimed is dropped, as a worker
-- that received it would (it skips the job and acknowledges the message); a message of another
-- task, or one that is not a task message, stays where it is, and the take ends.
-- Which job's keys a take needs is known only once it reads the message at the list's end (and
-- the job's record): keys the call did not declare it asks for in its reply, not by an error,
-- since a message it dropped on the way stays dropped; the caller takes again with them.
-- Either reply names the keys of the jobs of the next messages at the list's end (as many as a
-- take looks at when it asks, ARGV[9] when it took one), for the caller's next take to declare:
-- with a few threads taking at once, the message at the end when it takes is most often one of
-- those.
-- KEYS: the queue lists. ARGV: worker id, now, lease seconds, timeout error JSON, max attempts,
-- worker-lost error JSON, the generation task's name, most messages to look at, messages whose
-- keys to name.
-- Returns {} (nothing to take), {'!need', label, ...} (take again with these keys declared), or
-- {job id, labels of the next messages' keys (one a line), field, value, ...}: the claimed job's
-- record.
-- A task message's task name and id (its headers'): by word_field (common.lua) when both are
-- plain words, else decoded. nil when it is no task message.
local function task_of(message)
  local task = word_field(message, 'task')
  local id = task and word_field(message, 'id')
  if id then return task, id end
  local ok, decoded = pcall(cjson.decode, message)
  local headers = ok and type(decoded) == 'table' and decoded['headers']
  if type(headers) ~= 'table' then return nil, nil end
  return headers['task'], headers['id']
end

local c = {now = ARGV[2], lease_s = ARGV[3], timeout_error = ARGV[4], max_attempts = ARGV[5],
           lost_error = ARGV[6]}

-- Labels of the records and `start` deliveries of the jobs of the last `count` messages of the
-- first list that has any, appended to `out`.
local function next_labels(out, count)
  if count < 1 then return out end
  for _, list in ipairs(KEYS) do
    local messages = redis.call('LRANGE', list, -count, -1)
    if #messages > 0 then
      for _, message in ipairs(messages) do
        local task, id = task_of(message)
        if task == ARGV[7] and type(id) == 'string' then
          out[#out + 1] = L.job_key(id)
          out[#out + 1] = L.webhook_delivery_key(id, 'start')
        end
      end
      return out
    end
  end
  return out
end

-- A reply asking for `labels`, and for the keys of as many messages as a take may look at.
local function asking(labels)
  table.insert(labels, 1, '!need')
  return next_labels(labels, tonumber(ARGV[8]))
end

local looked = 0
for _, list in ipairs(KEYS) do
  while looked < tonumber(ARGV[8]) do
    local message = redis.call('LINDEX', list, -1)
    if not message then break end
    local task, job_id = task_of(message)
    if task ~= ARGV[7] or type(job_id) ~= 'string' then return {} end  -- left for Celery's consumer
    local record = L.job_key(job_id)
    if #missing({record}) > 0 then return asking({}) end
    local job = key(record)
    local plan = claim_plan(job, job_id, ARGV[1], c)
    local absent = missing(plan.labels)
    if #absent > 0 then return asking(absent) end
    redis.call('RPOP', list)
    looked = looked + 1
    if claim_apply(job, job_id, ARGV[1], c, plan) == 'claimed' then
      local reply = {job_id, table.concat(next_labels({}, tonumber(ARGV[9])), '\n')}
      for _, item in ipairs(redis.call('HGETALL', job)) do reply[#reply + 1] = item end
      return reply
    end
  end
end
return {}
