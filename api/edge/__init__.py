"""The HTTP edge: one request pipeline for both ways in (FastAPI's routes and the raw-ASGI hot
path), auth, rate and concurrency limits, error mapping, observation, the server protocol."""
