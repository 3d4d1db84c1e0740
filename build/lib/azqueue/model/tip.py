"""Tips: the messages in the pending queues, ``base64(JSON {taskId, runId, signature})``.

A tip only says "look at run ``runId`` of ``taskId``"; the Task entity in Azure
Tables is the truth. The signature (HMAC-SHA256 over ``<taskQueueId>/<taskId>/<runId>``)
stops a worker from claiming runs it never received, by accident or on purpose, and
binds the tip to the task queue it was issued for: a tip that reaches another task
queue's pending queue (a refused createTask naming another tenant's taskId puts one there
for a moment) verifies against no task but one of that queue, so it is claimable only
where its task lives. Tips signed over ``<taskId>/<runId>`` alone (``TipForm.RUN``: the
form of earlier releases, which read no other) still verify, and are signed so while
replicas of such a release serve beside this one (``AZQUEUE_TIP_FORM=run``); every claim
checks the task's queue itself, so they bind nothing less in practice (see
docs/threat-model.md and docs/operating/upgrades.md). Several secrets may be configured:
the first signs, every one verifies, so a secret can be rotated by adding the new one
first and dropping the old one once the tips signed with it are gone.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from enum import StrEnum

from azqueue.model import jsontext
from azqueue.model.signing import Macs


@dataclass(frozen=True, slots=True)
class Tip:
    task_id: str
    run_id: int
    signature: str

    def encode(self) -> str:
        body = json.dumps({"taskId": self.task_id, "runId": self.run_id,
                           "signature": self.signature}, separators=(",", ":"))
        return base64.b64encode(body.encode()).decode()

    @classmethod
    def decode(cls, text: str) -> Tip:
        """ValueError when ``text`` is not a tip."""
        try:
            data = jsontext.loads(base64.b64decode(text, validate=True))
            return cls(task_id=str(data["taskId"]), run_id=int(data["runId"]),
                       signature=str(data["signature"]))
        except (binascii.Error, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"not a tip: {e}") from None


class TipForm(StrEnum):
    """What the signature of the tips a replica puts covers; both verify everywhere."""

    TASK_QUEUE = "task-queue"  # <taskQueueId>/<taskId>/<runId>
    RUN = "run"  # <taskId>/<runId>: all that releases before the task queue's was covered read


class TipSigner:
    """Signs tips with the newest secret, in ``form``, and verifies them with any of the
    secrets, in either form."""

    def __init__(self, secrets: tuple[str, ...], form: TipForm = TipForm.TASK_QUEUE) -> None:
        if not secrets:
            raise ValueError("at least one tip secret is needed")
        self._macs = Macs(tuple(s.encode() for s in secrets))
        self.form = form

    def sign(self, task_queue_id: str, task_id: str, run_id: int) -> str:
        if self.form is TipForm.RUN:
            return self._macs.sign(f"{task_id}/{run_id}".encode())
        return self._macs.sign(f"{task_queue_id}/{task_id}/{run_id}".encode())

    def tip(self, task_queue_id: str, task_id: str, run_id: int) -> Tip:
        return Tip(task_id, run_id, self.sign(task_queue_id, task_id, run_id))

    def verify(self, task_queue_id: str, task_id: str, run_id: int, signature: str) -> bool:
        """Constant-time check of ``signature`` against every configured secret: signed
        for run ``run_id`` of ``task_id`` in ``task_queue_id`` (or, as earlier releases
        signed, for the run alone)."""
        bound = self._macs.verify(f"{task_queue_id}/{task_id}/{run_id}".encode(), signature)
        legacy = self._macs.verify(f"{task_id}/{run_id}".encode(), signature)
        return bound or legacy
