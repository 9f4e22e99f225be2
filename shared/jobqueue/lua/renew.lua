-- A worker renews the leases of the jobs it runs (with each heartbeat). KEYS: none of its own
-- (each job's record is declared).
-- ARGV: worker id, lease end (Unix seconds), job ids...
-- Returns the ids this worker no longer holds (canceled, ended, or handed to another worker
-- after a lapse): the worker stops generating them.
local records = {}
for i = 3, #ARGV do records[#records + 1] = L.job_key(ARGV[i]) end
need(records)
local lost = {}
for i = 3, #ARGV do
  local key = job_key(ARGV[i])
  local rec = redis.call('HMGET', key, 'status', 'worker')
  if rec[1] == 'running' and rec[2] == ARGV[1] then
    redis.call('HSET', key, 'lease', ARGV[2])
    redis.call('ZADD', K.leases, ARGV[2], ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
