"""OpenAI's wire format for genq jobs, for the routes in api/routes/openai.py (and the batch lines
of api/batches/lines.py): requests.py (the request models, and the genq job each asks for),
responses.py (a finished job as a completion object), chunks.py (a job's output as stream
chunks), waiting.py (waiting for a completion's job), errors.py (OpenAI's error shape, and the
route class that answers in it), kind.py (chat or text)."""
