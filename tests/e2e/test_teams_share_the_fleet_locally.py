"""Two teams share the fleet on the local cloud (issue 20): speech's high-priority job runs on
vision's idle quota; when vision fills its quota, the borrowed GPUs are preempted back, after a
checkpoint, and speech's job waits in its place, then resumes from that checkpoint once vision's
job is done. The real handlers, reconciler, bootstrap and trainer, on one machine."""

from __future__ import annotations

import json

import pytest

from gpujobs.domain.states import JobState, Reason
from gpujobs_local.stack import MOTO_SENDER
from tests.e2e.conftest import Stage, digits_spec

pytestmark = [pytest.mark.integration, pytest.mark.training]

TEAMS = json.dumps(
    {
        "teams": {
            "vision": {"principals": [MOTO_SENDER], "gpus": 2},
            "speech": {"principals": [MOTO_SENDER], "gpus": 0, "borrow": True},
        }
    }
)
"""Every local message comes from moto's one sender: both teams list it."""


@pytest.mark.timeout(420)
@pytest.mark.parametrize("session_options", [{"teams": TEAMS}], ids=["two-teams"])
def test_a_borrowed_gpu_is_preempted_back_after_a_checkpoint_and_the_borrower_resumes_from_it(stage: Stage) -> None:
    # given speech's high-priority job, which can run only on vision's idle quota
    borrower = stage.submit(
        digits_spec(
            steps=500, checkpoint_every=20, step_sleep=0.05, team="speech", name="speech-digits", priority="high"
        )
    )
    stage.wait_running(borrower)
    lent = stage.job(borrower)
    assert lent.admission is not None
    assert lent.admission.borrowed == 2
    stage.wait("a first checkpoint of the borrower", lambda: stage.job(borrower).checkpoint_step is not None, 120)

    # when vision submits a job of its own that fills its quota
    owner = stage.submit(digits_spec(steps=80, checkpoint_every=40, team="vision", name="vision-digits"))
    stage.wait_running(owner)

    # then speech's borrowed GPUs are taken back: checkpoint first, then its gang goes and it waits again
    stage.wait("the preemption's request", lambda: stage.job(borrower).stop_request is not None, 60)
    asked_at = stage.job(borrower).stop_request
    assert asked_at is not None
    assert asked_at.reason is Reason.PREEMPTED
    before = asked_at.checkpoint_step_at_request or 0
    stage.wait("the borrower back in the queue", lambda: stage.job(borrower).admission is None, 180)
    requeued = stage.job(borrower)
    assert requeued.state is JobState.QUEUED, requeued.status_detail
    assert (JobState.RUNNING, JobState.QUEUED, Reason.PREEMPTED) in [
        (h.source, h.target, h.reason) for h in requeued.history
    ]
    kept = requeued.checkpoint_step
    assert kept is not None
    assert kept > before  # the checkpoint the preemption asked for, newer than the one before it
    assert requeued.interruptions == 0  # a preemption is not a spot interruption

    # and once vision's job is done, speech's job is admitted again and resumes from that checkpoint
    done = stage.wait_state(owner, JobState.SUCCEEDED, JobState.FAILED, timeout=150)
    assert done.state is JobState.SUCCEEDED, done.status_detail
    finished = stage.wait_state(borrower, JobState.SUCCEEDED, JobState.FAILED, timeout=240)
    assert finished.state is JobState.SUCCEEDED, finished.status_detail
    (instance,) = finished.attempts[-1].instance_ids
    resumed = stage.trainer_line(instance, "resumed")
    assert resumed is not None, stage.log_text(instance)[-2000:]
    # from the newest commit of the preempted gang: the one asked for, or the save its SIGTERM made after
    preempted_commits = [c.step for c in stage.checkpoints(1, job_id=borrower)]
    assert resumed["step"] == max(preempted_commits)
    assert resumed["step"] >= kept
    final = stage.trainer_line(instance, "final")
    assert final is not None
    assert final["step"] == 500
    stage.wait_nothing_running()
