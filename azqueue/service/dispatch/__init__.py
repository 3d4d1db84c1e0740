"""How pending work reaches a worker: the tips in the pending queues and their rules
(``tips.py``), the claimWork callers waiting in this process (``waiting.py``), the
doorbell that tells the replicas a task queue's tips became visible (``doorbell.py``)
and its transports (``brokerbell.py``, ``tablebell.py``), which of a task queue's
queues hold visible tips (``hints.py``) and pollTaskUrls (``taskurls.py``).

May use: ``azqueue.service.common``.
"""
