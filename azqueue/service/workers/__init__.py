"""The workers and task queues the queue has seen: their records, quarantine and the
worker metadata listings (``workers.py``).

May use: ``azqueue.service.common``.
"""
