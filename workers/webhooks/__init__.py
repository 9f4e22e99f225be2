"""Webhook deliveries, run by workers on the webhooks queue: the Celery tasks (tasks.py) and the
`output` notices' throttle (output.py); what a delivery is, its claims, retries and ordering
(delivery.py); the deliveries a task thread takes from the queue itself (intake.py); what a
delivery sends (bodies.py); one HTTP attempt (client.py) over kept connections (connections.py);
and what an attempt's result means (outcomes.py).

Nothing is imported here: the job store's worker side imports bodies.py alone, without the HTTP
client or the Celery tasks."""
