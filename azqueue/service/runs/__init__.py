"""A run's life, from pending to resolved: the shared core of every change
(``changes.py``), claimTask and reclaimTask (``claims.py``), claimWork
(``workclaimer.py``), reports, cancel, claim expiry and deadlines (``resolution.py``,
with the deadline triggers, ``triggers.py``, and the tip repair, ``repair.py``),
rerunTask (``rerun.py``), changing a task's priority (``priority.py``), the claim index
(``claimindex.py``), this process's copies of tasks (``cache.py``) and the dependency
graph, which a resolution passes on (``dependencies.py``).

May use: ``azqueue.service.common``, ``azqueue.service.dispatch``,
``azqueue.service.workers``.
"""
