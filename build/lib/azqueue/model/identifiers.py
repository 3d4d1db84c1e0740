"""The names the Queue API gives tasks, workers and task queues, as Taskcluster's schemas
define them: ``provisionerId``, ``workerType``, ``workerGroup`` and ``workerId`` are 1-38
of ``[a-zA-Z0-9_-]``; a ``taskQueueId`` is ``<provisionerId>/<workerType>``; a ``taskId``
and a ``taskGroupId`` are v4 slugids (22 characters of URL-safe base64). A task's own
``workerType`` is narrower (Taskcluster's task definition, and every answer that carries
it): lowercase letters, digits and ``-``, starting with a letter and not ending with ``-``.

The JSON schemas served to clients (``api/schemas``) state the same patterns in their own
words; a unit test checks that they agree with these.
"""

from __future__ import annotations

import re

_PART = r"[a-zA-Z0-9_-]{1,38}"

IDENTIFIER = re.compile(rf"^{_PART}$")
TASK_QUEUE_ID = re.compile(rf"^{_PART}/{_PART}$")
SLUGID = re.compile(r"^[A-Za-z0-9_-]{8}[Q-T][A-Za-z0-9_-][CGKOSWaeimquy26-][A-Za-z0-9_-]{10}[AQgw]$")
_TASK_WORKER_TYPE = r"[a-z]([-a-z0-9]{0,36}[a-z0-9])?"
WORKER_TYPE_OF_TASK = re.compile(rf"^{_TASK_WORKER_TYPE}$")
TASK_QUEUE_ID_OF_TASK = re.compile(rf"^{_PART}/{_TASK_WORKER_TYPE}$")
