-- A worker claims a job it received from the broker (common.lua's claim_plan says when it may).
-- KEYS: job. ARGV: worker id, now, lease seconds, timeout error JSON, job id, max attempts,
-- worker-lost error JSON.
-- Returns {outcome, status}; 'claimed' is followed by the job's record as the claim left it
-- (field, value, ...): the worker needs it to run the job, and reading it here saves a round
-- trip per job.
local job = KEYS[1]
local c = {now = ARGV[2], lease_s = ARGV[3], timeout_error = ARGV[4], max_attempts = ARGV[6], lost_error = ARGV[7]}
local plan = claim_plan(job, ARGV[5], ARGV[1], c)
need(plan.labels)
local outcome, status = claim_apply(job, ARGV[5], ARGV[1], c, plan)
local reply = {outcome, status}
if outcome == 'claimed' then
  for _, item in ipairs(redis.call('HGETALL', job)) do reply[#reply + 1] = item end
end
return reply
