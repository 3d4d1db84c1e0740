"""The owner of tips (``azqueue.service.dispatch.tips``): what a change keeps of a task's
records of its messages, and that no other part of the service moves a tip."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.definition import normalize
from azqueue.model.priority import Priority
from azqueue.model.task import ReasonResolved, RunState
from azqueue.service.dispatch.tips import records_after
from azqueue.storage.taskrows import HeldMessage, LiveTip, Stored

SERVICE = Path(__file__).resolve().parents[2] / "azqueue" / "service"
NOW = timeutil.parse("2030-01-01T00:00:00.000Z")
QUEUE = "az-pending-lowest"
TIMEOUT = timedelta(minutes=20)


def _stored(task: model.Task, held: HeldMessage | None = None,
            live: LiveTip | None = None) -> Stored:
    return Stored(task, "etag", held, frozenset({"m0", "m1"}), live_tip=live)


def _pending() -> model.Task:
    body = {"taskQueueId": "prov/wt", "created": timeutil.fmt(NOW),
            "deadline": timeutil.fmt(NOW + timedelta(hours=1)), "retries": 1,
            "payload": {}, "metadata": {}}
    return model.new_task("T", normalize("T", body, NOW), NOW)


def test_a_claim_records_the_message_it_took_and_keeps_the_tips() -> None:
    pending = _pending()
    stored = _stored(pending, live=LiveTip(0, QUEUE, "m1", "r1"))
    claimed = model.claim(pending, 0, "wg", "w", NOW, TIMEOUT)
    took = HeldMessage(0, QUEUE, "m1", "r2")
    kept = records_after(stored, claimed, took)
    assert kept.held == took
    assert kept.tips == stored.tips
    assert kept.live_tip is None  # its run is pending no more


def test_a_held_message_stays_while_its_run_runs_and_goes_when_it_ends() -> None:
    claimed = model.claim(_pending(), 0, "wg", "w", NOW, TIMEOUT)
    held = HeldMessage(0, QUEUE, "m1", "r2")
    reclaimed = model.reclaim(claimed, 0, NOW, TIMEOUT)
    assert records_after(_stored(claimed, held), reclaimed).held == held
    resolved = model.resolve(claimed, 0, RunState.COMPLETED, ReasonResolved.COMPLETED, NOW)
    assert records_after(_stored(claimed, held), resolved).held is None
    # A claim that expires the run it held: the message is the retry's to hold, not its.
    assert records_after(_stored(claimed, held), resolved,
                         HeldMessage(0, QUEUE, "m1", "r3")).held is None


def test_a_new_priority_makes_every_recorded_tip_and_the_live_tip_stale() -> None:
    pending = _pending()
    stored = _stored(pending, live=LiveTip(0, QUEUE, "m1", "r1"))
    moved = model.change_priority(pending, Priority.HIGHEST, NOW)
    kept = records_after(stored, moved)
    assert kept.tips == frozenset()
    assert kept.live_tip is None
    unchanged = records_after(stored, pending)
    assert unchanged.tips == stored.tips and unchanged.live_tip == stored.live_tip


def test_the_live_tip_is_kept_only_for_the_pending_run_it_was_put_for() -> None:
    pending = _pending()
    stale = LiveTip(1, QUEUE, "m1", "r1")  # put for a run that is not the last
    assert records_after(_stored(pending, live=stale), pending).live_tip is None
    claimed = model.claim(pending, 0, "wg", "w", NOW, TIMEOUT)
    live = LiveTip(0, QUEUE, "m1", "r1")
    assert records_after(_stored(pending, live=live), claimed).live_tip is None


# What the parts of the service that are not the owner of tips may do with Azure queues.
# A message operation (put, update, delete, drop, release, postpone, receive) is the owner
# of tips' alone, but on a queue a module owns itself; a pending queue is named only where
# it is read, not moved.
_MESSAGE_OPS = {"put", "update", "delete", "drop", "release", "postpone", "receive",
                "receive_batch"}
_OWN_QUEUES = {
    "dispatch/tips.py": "the pending queues: every transition of a tip",
    "runs/triggers.py": "the deadline trigger batches",
    "runs/resolution.py": "the deadline queues it resolves from",
    "runs/dependencies.py": "the dependency passes' triggers",
    "tasks/groups.py": "the task group passes",
}
_READS_PENDING = {
    "dispatch/tips.py": "every transition of a tip",
    "dispatch/taskurls.py": "signs SAS URLs for workers",
    "dispatch/hints.py": "peeks whether a queue holds visible tips",
    "tasks/counts.py": "counts and peeks the tips waiting",
    "upkeep/idlequeues.py": "deletes the empty pending queues of expired task queues",
    "wiring.py": "builds them",
}


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(SERVICE)): ast.parse(p.read_text())
            for p in sorted(SERVICE.rglob("*.py"))}


def test_only_the_owner_of_tips_moves_messages_of_the_pending_queues() -> None:
    moving: set[str] = set()
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in _MESSAGE_OPS and \
                    ast.unparse(node.func.value).split(".")[-1] in {"queues", "pending"}:
                moving.add(name)
    assert moving == set(_OWN_QUEUES), \
        "a module other than those owning their queues moves Azure messages: route tip " \
        "transitions through Tips (service/dispatch/tips.py)"


def test_only_the_parts_that_read_them_know_the_pending_queues() -> None:
    knowing = {name for name, tree in _modules().items()
               if any(isinstance(node, ast.Name) and node.id == "PendingQueues"
                      for node in ast.walk(tree))}
    assert knowing == set(_READS_PENDING)


def test_a_message_a_claim_now_holds_is_recorded_as_one_of_the_tasks_tips() -> None:
    """A tip handed to a claimWork caller before it was recorded is recorded by the claim
    that holds it: when the claim is not reclaimed, the message is the retry's tip."""
    pending = _pending()
    claimed = model.claim(pending, 0, "wg", "w", NOW, TIMEOUT)
    took = HeldMessage(0, QUEUE, "handed", "r1")
    assert records_after(_stored(pending), claimed, took).tips == {"m0", "m1", "handed"}
    # Kept as it is when the claim holds no new message, or the priority moved.
    assert records_after(_stored(pending), claimed, None).tips == {"m0", "m1"}
