"""Task events on AMQP exchanges, delivered at least once through a transactional outbox.

Every state change writes its messages (``azqueue.model.events``) as outbox rows in the
task's partition, in the same batch transaction as the change itself, so a change and
its messages are durable together. The process that made the change publishes them from
memory right after it (the messages are a pure function of the change: nothing is read
back), with publisher confirms. Published rows are not deleted one by one: they stay in
the task's partition and go with it when the task expires.

What makes sure a stored change is published even if its process dies is a lease, not a
message per change: each process holds one message in ``<prefix>-events-leases``,
invisible for ``recovery_delay`` and renewed three times per delay (a few requests per
minute, whatever the rate of changes). It names the process (a ``writer`` id that every
outbox row key it writes ends with) and the time from which its outbox rows may be
unpublished (the start of its oldest change in flight, or the renewal). If the process
dies, the lease reappears and the events resolver of any replica publishes that
process's outbox rows written since then (one scan of the tasks table's outbox rows; a
crash is rare, so this costs nothing on the hot path). When publishing fails while the
process lives (the broker is away), it hands the change over with a trigger message in
``<prefix>-events`` (``{taskId, after}``), which the resolver retries until it is
published. Messages may therefore repeat (after a recovery, a row published just before
the crash goes again), and a recovered one may arrive after later messages of the same
task; none is lost.
"""
