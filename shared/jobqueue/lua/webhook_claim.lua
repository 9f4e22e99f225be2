-- Claims a webhook delivery's generation for a message Celery delivered and, when claimed, reads
-- what its attempt needs (workers/webhooks/delivery.py; claim_delivery and look_delivery in common.lua
-- say what each outcome and read means).
-- KEYS: delivery state, the job's (or batch's) record, and for a job's `completed` its `start`
-- delivery state. ARGV: generation, now, lease until, ttl (the state's, when the record has no
-- expiry), the record's field of a `start` message never sent. Declared: the signing secrets of
-- the owner frozen with the delivery (asked for).
-- Returns {outcome, lease} or, claimed, {outcome, lease, look}.
local secrets, frozen = look_labels(KEYS[1])
need(secrets)
return claim_and_look(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], KEYS[3] or '', ARGV[5], frozen)
