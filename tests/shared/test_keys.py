"""shared/keys.py: the key builders make the keys their templates name, every key is under the
genq prefix except kombu's own, and a queue's priority lists are the ones kombu reads (checked
against a real Celery publish in tests/shared/test_messages.py)."""

from __future__ import annotations

import string

from shared import keys
from shared.jobqueue import kombu_layout


def _templates() -> dict[str, str]:
    return {name: value for name, value in vars(keys).items() if name.isupper() and isinstance(value, str)
            and "{" in value}  # fmt: skip


def test_every_template_is_under_the_prefix() -> None:
    for name, template in _templates().items():
        if name == "WEBHOOK_MESSAGE_FIELD":  # a field of the job's hash, not a key
            continue
        assert template.startswith(keys.PREFIX + ":"), name


def test_builders_fill_their_template() -> None:
    assert keys.job("j1") == "genq:job:j1"
    assert keys.owner_jobs("key-a") == "genq:owner:key-a:jobs"
    assert keys.job_stream("j1") == "genq:job:j1:stream"
    assert keys.batch_window("batch_1") == "genq:batch:batch_1:window"
    assert keys.webhook_key_secrets("key-a") == (
        "genq:webhook-secret:key-a",
        "genq:webhook-secret:key-a:previous",
    )
    assert keys.webhook_message_field("completed") == "webhook_message:completed"
    for template in _templates().values():  # each builder's template has only named fields
        assert all(field for _, field, _, _ in string.Formatter().parse(template) if field is not None)


def test_idempotency_keys_hash_the_client_key() -> None:
    """A client's Idempotency-Key may be long or odd; the Redis key is a fixed-size digest, one per
    owner, so two owners with the same client key never share a job."""
    key = keys.idempotency("key-a", "x" * 10_000 + " spaces:colons")
    assert key.startswith("genq:idem:key-a:") and len(key.rsplit(":", 1)[1]) == 64
    assert keys.idempotency("key-a", "k") == keys.idempotency("key-a", "k") != keys.idempotency("key-b", "k")


def test_queues_and_their_priority_lists() -> None:
    queue = keys.queue_for_model("placeholder-echo")
    assert queue == "genq.placeholder-echo"
    assert keys.queue_key(queue, 0) == queue  # priority 0 is the bare list, served first
    assert keys.queue_key(queue, 9) == queue + kombu_layout.PRIORITY_SEPARATOR + "9"
