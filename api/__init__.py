"""The API tier: api/app.py builds the app from rooms that import one way, each only from those
after it: routes (HTTP resources, the hot path) -> batches -> openai -> jobs (the job queue and
store) -> edge (who may ask what: the request pipeline, auth, errors, rate and concurrency limits,
body caps, metrics, the uvicorn adapter) -> redis_io. tests/test_layout.py (API_ROOMS) checks it."""
