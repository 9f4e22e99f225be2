"""The job queue in one room: what submit, take, claim, finish, hand_back, reap, renew and cancel do
to Redis. docs/queue.md describes its states, transitions and keys for a reader.

- lua/: the scripts, one per move, each checking and setting a job's state atomically;
- scripts.py: how a script is called (every key it touches declared in its KEYS) and its prelude;
- records.py: the codec of a job's record and its views, and a job's Celery message;
- kombu_layout.py: where kombu keeps a message (its lists, its unacked hash), known here only;
- reaper.py: what moves a job when no worker does (a lapsed lease, a deadline, a lost message).

The tiers call it thinly: the API writes (api/jobs/store.py), the worker takes (workers/jobs.py).
"""
