"""What keeps storage in shape and says it is: the expiry pass (``expiry.py``), the
pending queues of idle task queues it deletes (``idlequeues.py``), and the heartbeat's
storage check (``health.py``).

May use: ``azqueue.service.common``, ``azqueue.service.workers``,
``azqueue.service.artifacts``.
"""
