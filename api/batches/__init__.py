"""Files and the OpenAI Batch API: the batch door (service), the feeder that turns lines into
jobs, line parsing, file records and storage."""
