"""The API's Redis I/O, on redis-py's public asyncio face: how the API builds its clients
(client.py), how it sends commands, batched across concurrent requests (commands.py,
batching.py), and how it holds a pub/sub subscription (subscription.py). Nothing here knows HTTP
or jobs: api/edge serves HTTP, api/jobs says what the commands and messages mean."""
