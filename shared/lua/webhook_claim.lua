-- Claims a webhook delivery's generation for a message Celery delivered (workers/deliveries.py;
-- claim_delivery in common.lua says what each outcome means).
-- KEYS: delivery state, the job's (or batch's) record. ARGV: generation, now, lease until, ttl
-- (the state's, when the record has no expiry). Returns {outcome, lease}.
local outcome, lease = claim_delivery(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return {outcome, lease}
