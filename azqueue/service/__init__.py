"""The queue's operations: model + storage, never HTTP.

One room a concern, each a package of its own whose first paragraph says what it owns
and which rooms it may use; a room imports only rooms below it, never one above (a
test of the source checks it). From the bottom up: ``common`` (awaiting a few at a
time, pages), ``dispatch`` (how pending work reaches workers: tips, the doorbell,
waiters, hints), ``workers`` (worker and task queue records), ``artifacts``, ``runs``
(a run's life: claims, changes, resolution, the dependency graph), ``tasks``
(definitions, groups, reads and counts) and ``upkeep`` (expiry, idle queues, the
health check). ``wiring.py``, above them all, declares every component with the
collaborators it needs and how it starts and stops (the order follows from the needs);
no room imports it.
"""
