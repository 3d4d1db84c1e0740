"""What a task is and who reads it: createTask, scheduleTask and the definition and
status reads (``definitions.py``), many tasks read at once (``batch.py``), task groups
(``groups.py``, and ``groupowner.py``, the schedulerId a group belongs to), and the
pending and claimed counts and listings of a task queue (``counts.py``).

May use: ``azqueue.service.common``, ``azqueue.service.dispatch``,
``azqueue.service.workers``, ``azqueue.service.runs``.
"""
