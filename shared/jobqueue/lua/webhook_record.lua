-- Ends a webhook delivery's generation (workers/webhooks/delivery.py; record_delivery in common.lua).
-- KEYS: delivery state, delivery log, pending index, the job's (or batch's) record. ARGV:
-- generation, ttl (the log's, when the record has no expiry), log entry ('' for none), final
-- ('1'/'0'), fields...
record_delivery(KEYS, ARGV)
return 1
