-- A worker's task thread, its job over, takes the next queued job straight from the broker's
-- lists and claims it in the same step: no message is ever out of the list without its job
-- claimed (and so covered by the job's lease and the lease reaper). The order is the broker's:
-- KEYS are the lists in the order the worker's BRPOP names them (priority 0 first), and each is
-- popped at the end BRPOP pops. A message whose job cannot be claimed is dropped, as a worker
-- that received it would (it skips the job and acknowledges the message); a message of another
-- task, or one that is not a task message, goes back where it was, and the take ends.
-- KEYS: the queue lists. ARGV: worker id, now, lease seconds, timeout error JSON, max attempts,
-- worker-lost error JSON, the generation task's name, most messages to look at.
-- Returns {} (nothing to take), or {job id, field, value, ...}: the claimed job's record.
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
local looked = 0
for _, list in ipairs(KEYS) do
  while looked < tonumber(ARGV[8]) do
    local message = redis.call('RPOP', list)
    if not message then break end
    looked = looked + 1
    local task, job_id = task_of(message)
    if task ~= ARGV[7] or type(job_id) ~= 'string' then
      redis.call('RPUSH', list, message)
      return {}
    end
    local job = job_key(job_id)
    if claim_job(job, job_id, ARGV[1], c) == 'claimed' then
      local reply = {job_id}
      for _, item in ipairs(redis.call('HGETALL', job)) do reply[#reply + 1] = item end
      return reply
    end
  end
end
return {}
