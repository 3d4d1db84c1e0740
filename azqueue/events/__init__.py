"""Task events on AMQP exchanges, delivered at least once through a transactional outbox.

Every state change writes its messages (``azqueue.model.events``) as outbox rows in the
task's partition, in the same batch transaction as the change itself, so a change and
its messages are durable together. Before the change, a trigger message is put into the
internal queue ``<prefix>-events``, invisible for ``recovery_delay``. Right after the
change the process publishes the rows (with publisher confirms), deletes them and then
the trigger. If it dies, or the broker is away, in between, the trigger reappears and
the events resolver (any replica) publishes what is left. Messages may therefore repeat,
and a recovered one may arrive after later messages of the same task; none is lost.
"""
