"""The names the Queue API gives tasks, workers and task queues, as Taskcluster's schemas
define them: ``provisionerId``, ``workerType``, ``workerGroup`` and ``workerId`` are 1-38
of ``[a-zA-Z0-9_-]``; a ``taskQueueId`` is ``<provisionerId>/<workerType>``; a ``taskId``
and a ``taskGroupId`` are v4 slugids (22 characters of URL-safe base64).

The JSON schemas served to clients (``api/schemas``) state the same patterns in their own
words; a unit test checks that they agree with these.
"""

from __future__ import annotations

import re

_PART = r"[a-zA-Z0-9_-]{1,38}"

IDENTIFIER = re.compile(rf"^{_PART}$")
TASK_QUEUE_ID = re.compile(rf"^{_PART}/{_PART}$")
SLUGID = re.compile(r"^[A-Za-z0-9_-]{8}[Q-T][A-Za-z0-9_-][CGKOSWaeimquy26-][A-Za-z0-9_-]{10}[AQgw]$")
