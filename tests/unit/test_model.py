"""The pure model: transitions, tips and timestamps, without any service."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from azqueue.errors import Conflict
from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.definition import normalize
from azqueue.model.task import ReasonResolved, RunState
from azqueue.model.signing import Macs
from azqueue.model.tip import Tip, TipForm, TipSigner

NOW = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
TIMEOUT = timedelta(minutes=20)


def _task(retries: int = 1) -> model.Task:
    body = {"taskQueueId": "p/w", "created": timeutil.fmt(NOW),
            "deadline": timeutil.fmt(NOW + timedelta(days=1)), "retries": retries,
            "payload": {}, "metadata": {}}
    return model.new_task("T", normalize("T", body, NOW), NOW)


def test_claim_then_expiry_by_the_rewritten_tip_schedules_and_claims_the_retry() -> None:
    """'we will have to resolve lower runIds as exception ... whenever, a task is claimed' (docs/workers/sas.md)."""
    task = model.claim(_task(), 0, "g", "a", NOW, TIMEOUT)
    with pytest.raises(Conflict, match="claimed until"):
        model.claim(task, 1, "g", "b", NOW + TIMEOUT - timedelta(seconds=1), TIMEOUT)
    later = NOW + TIMEOUT
    task = model.claim(task, 1, "g", "b", later, TIMEOUT)
    assert [(r.state, r.reason_resolved) for r in task.runs] == [
        (RunState.EXCEPTION, ReasonResolved.CLAIM_EXPIRED), (RunState.RUNNING, None)]
    assert task.retries_left == 0 and task.runs[1].worker_id == "b"
    # No retries left now: the next expiry resolves the task and claims nothing.
    final = model.claim(task, 2, "g", "c", later + TIMEOUT, TIMEOUT)
    assert len(final.runs) == 2 and final.state is model.TaskState.EXCEPTION


def test_expiry_tolerance_lets_an_early_tip_expire_the_claim() -> None:
    task = model.claim(_task(), 0, "g", "a", NOW, TIMEOUT)
    early = NOW + TIMEOUT - timedelta(seconds=2)
    assert len(model.claim(task, 1, "g", "b", early, TIMEOUT, timedelta(seconds=5)).runs) == 2


def test_claims_are_exclusive_and_repeatable_by_the_same_worker() -> None:
    task = model.claim(_task(), 0, "g", "a", NOW, TIMEOUT)
    assert model.claim(task, 0, "g", "a", NOW, TIMEOUT) is task
    with pytest.raises(Conflict, match="not pending"):
        model.claim(task, 0, "g", "b", NOW, TIMEOUT)


def test_reports_resolve_once_and_repeat_harmlessly() -> None:
    task = model.claim(_task(), 0, "g", "a", NOW, TIMEOUT)
    done = model.resolve(task, 0, RunState.COMPLETED, ReasonResolved.COMPLETED, NOW)
    assert model.resolve(done, 0, RunState.COMPLETED, ReasonResolved.COMPLETED, NOW) is done
    with pytest.raises(Conflict):
        model.resolve(done, 0, RunState.FAILED, ReasonResolved.FAILED, NOW)
    with pytest.raises(Conflict):
        model.reclaim(done, 0, NOW, TIMEOUT)


@pytest.mark.parametrize("reason,retried", [
    (ReasonResolved.WORKER_SHUTDOWN, model.ReasonCreated.RETRY),
    (ReasonResolved.INTERMITTENT_TASK, model.ReasonCreated.TASK_RETRY),
    (ReasonResolved.MALFORMED_PAYLOAD, None),
    (ReasonResolved.RESOURCE_UNAVAILABLE, None),
    (ReasonResolved.INTERNAL_ERROR, None),
])
def test_which_exceptions_retry(reason: ReasonResolved, retried: model.ReasonCreated | None) -> None:
    """'Some of these reasons, notably intermittent-task, worker-shutdown, and claim-expired,
    will trigger an automatic retry of the task' (docs/concepts.md)."""
    task = model.claim(_task(retries=3), 0, "g", "a", NOW, TIMEOUT)
    after = model.resolve(task, 0, RunState.EXCEPTION, reason, NOW)
    if retried is None:
        assert len(after.runs) == 1 and after.retries_left == 3
    else:
        assert after.runs[1].reason_created is retried and after.retries_left == 2


def test_deadline_resolves_the_unresolved_run_only_when_due() -> None:
    task = _task()
    assert model.resolve_deadline(task, NOW) is task
    late = model.resolve_deadline(task, task.deadline)
    assert late.runs[0].reason_resolved is ReasonResolved.DEADLINE_EXCEEDED
    assert model.resolve_deadline(late, task.deadline) is late


def test_background_expiry_waits_for_taken_until() -> None:
    task = model.claim(_task(), 0, "g", "a", NOW, TIMEOUT)
    assert model.expire_claim(task, 0, NOW + TIMEOUT - timedelta(microseconds=1)) is task
    expired = model.expire_claim(task, 0, NOW + TIMEOUT)
    assert expired.runs[1].state is RunState.PENDING
    assert model.expire_claim(expired, 0, NOW + TIMEOUT) is expired


def test_status_structure_matches_taskcluster_shape() -> None:
    status = model.claim(_task(), 0, "g", "a", NOW, TIMEOUT).status()
    assert set(status) == {"taskId", "provisionerId", "workerType", "taskQueueId", "schedulerId",
                           "projectId", "taskGroupId", "deadline", "expires", "retriesLeft",
                           "state", "runs"}
    assert status["runs"][0]["started"] == "2026-01-02T03:04:05.678Z"


def test_a_tip_verifies_only_for_the_task_queue_it_was_signed_for() -> None:
    signer = TipSigner(("secret-0123456789abcdef",))
    tip = signer.tip("tenant-a/pool", "T", 0)
    assert signer.verify("tenant-a/pool", "T", 0, tip.signature)
    assert not signer.verify("tenant-b/pool", "T", 0, tip.signature)
    assert not signer.verify("tenant-a/poo", "T", 0, tip.signature)


def test_tips_signed_by_earlier_releases_still_verify() -> None:
    """Earlier releases signed ``<taskId>/<runId>``: their tips, queued before an upgrade,
    are still claimable (claims check the task's queue themselves)."""
    secret = "secret-0123456789abcdef"
    earlier = Macs((secret.encode(),)).sign(b"T/0")
    assert TipSigner((secret,)).verify("any/queue", "T", 0, earlier)
    assert not TipSigner((secret,)).verify("any/queue", "T", 1, earlier)


def test_tips_signed_over_the_run_alone_verify_where_earlier_releases_verify_them() -> None:
    """``TipForm.RUN`` signs ``<taskId>/<runId>``, all that earlier releases check, and this
    release verifies such a tip for any task queue (a claim checks the task's queue)."""
    secret = "secret-0123456789abcdef"
    tip = TipSigner((secret,), TipForm.RUN).tip("tenant-a/pool", "T", 0)
    assert Macs((secret.encode(),)).verify(b"T/0", tip.signature)
    assert TipSigner((secret,)).verify("tenant-a/pool", "T", 0, tip.signature)
    bound = TipSigner((secret,)).tip("tenant-a/pool", "T", 0)
    assert not Macs((secret.encode(),)).verify(b"T/0", bound.signature)


def test_tips_sign_with_the_newest_secret_and_verify_with_all() -> None:
    old, new = "old-secret-0123456789", "new-secret-0123456789"
    tip = TipSigner((old,)).tip("p/w", "T", 3)
    rotated = TipSigner((new, old))
    assert rotated.verify("p/w", "T", 3, tip.signature)
    assert not rotated.verify("p/w", "T", 4, tip.signature)
    assert not TipSigner((new,)).verify("p/w", "T", 3, tip.signature)
    assert not rotated.verify("p/w", "T", 3, "not base64!")
    assert Tip.decode(tip.encode()) == tip
    with pytest.raises(ValueError):
        Tip.decode("bm90IGpzb24=")


@pytest.mark.parametrize("text,expected", [
    ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05.000Z"),
    ("2026-01-02T03:04:05.1Z", "2026-01-02T03:04:05.100Z"),
    ("2026-01-02T03:04:05.123456Z", "2026-01-02T03:04:05.123Z"),
    ("2026-01-02T04:04:05.000+01:00", "2026-01-02T03:04:05.000Z"),
    ("2026-01-02T03:04:05.999999Z", "2026-01-02T03:04:05.999Z"),  # cut, not rounded
    ("2026-01-01T00:30:00.5+01:00", "2025-12-31T23:30:00.500Z"),
])
def test_timestamps_accept_0_to_6_fraction_digits(text: str, expected: str) -> None:
    assert timeutil.normalize(text) == expected


@pytest.mark.parametrize("text", ["2026-01-02", "2026-01-02T03:04:05.1234567Z", "yesterday"])
def test_timestamps_reject_other_forms(text: str) -> None:
    with pytest.raises(ValueError):
        timeutil.parse(text)


def test_cancel_resolves_the_current_run_canceled_and_never_retries() -> None:
    """cancelTask: 'resolve the current run as exception with reasonResolved set to
    canceled'; 'if you try to cancel a task that isn't unscheduled, pending or running,
    this operation will just return the current task status' (Queue reference)."""
    pending = _task(retries=3)
    for task in (pending, model.claim(pending, 0, "g", "a", NOW, TIMEOUT)):
        canceled = model.cancel(task, NOW)
        assert [(r.state, r.reason_resolved) for r in canceled.runs] == [
            (RunState.EXCEPTION, ReasonResolved.CANCELED)]
        assert canceled.retries_left == 3 and canceled.runs[0].resolved == NOW
        assert model.cancel(canceled, NOW + TIMEOUT) is canceled
    unscheduled = model.Task("U", pending.definition, (), 3)
    [run] = model.cancel(unscheduled, NOW).runs
    assert (run.state, run.reason_created, run.reason_resolved) == (
        RunState.EXCEPTION, model.ReasonCreated.EXCEPTION, ReasonResolved.CANCELED)
    completed = model.resolve(model.claim(pending, 0, "g", "a", NOW, TIMEOUT), 0,
                              RunState.COMPLETED, ReasonResolved.COMPLETED, NOW)
    assert model.cancel(completed, NOW) is completed


def test_a_waiting_task_is_unscheduled_until_scheduled_and_never_after_its_deadline() -> None:
    waiting = model.Task("W", _task().definition, (), 1)
    assert waiting.state is model.TaskState.UNSCHEDULED and not waiting.state.resolved
    scheduled = model.schedule(waiting, NOW)
    assert [(r.run_id, r.state, r.reason_created) for r in scheduled.runs] == [
        (0, RunState.PENDING, model.ReasonCreated.SCHEDULED)]
    assert model.schedule(scheduled, NOW) is scheduled
    assert model.schedule(waiting, waiting.deadline) is waiting


def test_requires_all_completed_or_all_resolved() -> None:
    """'all-completed': every dependency completed; 'all-resolved': resolved in any way."""
    pending = _task()
    claimed = model.claim(pending, 0, "g", "a", NOW, TIMEOUT)
    completed = model.resolve(claimed, 0, RunState.COMPLETED, ReasonResolved.COMPLETED, NOW)
    failed = model.resolve(claimed, 0, RunState.FAILED, ReasonResolved.FAILED, NOW)
    canceled = model.cancel(pending, NOW)
    assert [model.satisfies(t, "all-completed") for t in (pending, claimed, completed, failed,
                                                          canceled)] == [False, False, True,
                                                                         False, False]
    assert [model.satisfies(t, "all-resolved") for t in (pending, claimed, completed, failed,
                                                         canceled)] == [False, False, True,
                                                                        True, True]
