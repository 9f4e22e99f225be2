"""The API's Redis I/O: how the API builds its clients (client.py, packing.py), how it sends
commands, batched across concurrent requests (commands.py, batching.py), and how it holds a pub/sub
subscription (subscription.py), on redis-py's public asyncio face; wire.py, the one module that
reads redis-py's private names, writes the batches on a connection of its own while the pinned
redis-py allows it, with redis-py's pipelines as its fallback. Nothing here knows HTTP or jobs:
api/edge serves HTTP, api/jobs says what the commands and messages mean."""
