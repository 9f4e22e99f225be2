-- A worker hands back a job it holds (drain timeout, or its engine died): the job is queued
-- again with a fresh queue deadline and a new message, so another worker finishes it. A drain
-- does not count as an attempt; an engine death does (the job may be what killed it).
-- KEYS: job. ARGV: worker id, job id, message, queue list, now, new deadline, count attempt (1/0).
-- Returns 1 when handed back, 0 when this worker no longer held the job.
local job, job_id = KEYS[1], ARGV[2]
local rec = redis.call('HMGET', job, 'status', 'worker', 'queue')
if rec[1] ~= 'running' or rec[2] ~= ARGV[1] then return 0 end
need({L.running_key(rec[3] or ''), L.queued_key(rec[3] or ''), L.key(ARGV[4])})
forget_delivery(job)
leave_running(job, job_id)
redis.call('HSET', job, 'worker', '')
redis.call('HDEL', job, 'started_at')
if ARGV[7] ~= '1' then redis.call('HINCRBY', job, 'attempts', -1) end
enqueue(job, job_id, ARGV[3], key(L.key(ARGV[4])), ARGV[6], ARGV[5])
return 1
