"""A policy stop's checkpoint-now is level-triggered, like every other effect (issue 19, item 9).

The stop is written first (checkpoint first, instances at the commit or at the 10 min deadline),
then SIGUSR1 goes out over SSM. If that one SendCommand fails, or the function dies between the
write and the call, nothing used to send it again: the stop waited its 10 minutes and took the
instances with the commit from before the request (step 100 while the trainer was at step 180).
Now every settle (each reconciler tick) sends it again once two minutes have passed since the last,
until a commit newer than the request is recorded.
"""

from __future__ import annotations

from gpujobs.domain.decisions import CHECKPOINT_RESEND_INTERVAL
from gpujobs.domain.fate import STOP_CHECKPOINT_DEADLINE
from gpujobs.domain.job import Job
from gpujobs.domain.reports import CheckpointReport
from gpujobs.domain.states import JobState, Reason
from gpujobs.service.repairs import Repair
from tests.service.conftest import World, spec


def idle_job_at_step_100(world: World, message_id: str = "msg-1", **overrides: object) -> tuple[Job, str]:
    job = world.submit(spec(**overrides), message_id=message_id).job
    (iid,) = job.instance_ids
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=100, uri="s3://b/step-100"))
    return job, iid


def trainer_answers(world: World, job: Job, step: int) -> None:
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=step, uri=f"s3://b/step-{step}"))


def test_a_stop_whose_checkpoint_now_failed_sends_it_again_and_stops_after_the_new_commit(world: World) -> None:
    job, iid = idle_job_at_step_100(world)

    # the idle alarm's stop is written, and its one SendCommand fails
    world.signaller.faults.fail_next("checkpoint_now")
    world.reactions.idle_alarm(iid)
    assert world.store.get(job.job_id).stop_request is not None
    assert world.signaller.signals == []

    # a tick a minute later leaves it alone (it may still be on its way); the next one sends it again
    world.clock.advance(minutes=1)
    assert world.reconciler.run().repairs[Repair.STOP_CHECKPOINTS_RESENT] == 0
    world.clock.advance(seconds=CHECKPOINT_RESEND_INTERVAL.total_seconds() - 60)
    assert world.reconciler.run().repairs[Repair.STOP_CHECKPOINTS_RESENT] == 1
    assert world.signaller.signals == [((iid,), f"gpujobs-{job.job_id}-a1")]
    assert world.compute.instances[iid].state == "running"

    # the trainer answers it with step 180: the stop takes the instance after that commit
    trainer_answers(world, job, 180)
    assert world.compute.instances[iid].state == "terminated"
    world.reactions.instance_state(iid, "terminated")
    stopped = world.store.get(job.job_id)
    assert stopped.state is JobState.STOPPED
    assert stopped.history[-1].reason is Reason.IDLE
    assert stopped.checkpoint_step == 180  # not the step-100 commit from before the request


def test_a_stop_lost_between_its_write_and_its_signal_is_answered_by_the_next_ticks(world: World) -> None:
    """The function died after the write: no call was even tried. The record alone brings it back."""
    job, iid = idle_job_at_step_100(world)
    world.reactions.request_stop(job.job_id, Reason.MAX_RUNTIME, detail="ran 61 min of 60")
    world.signaller.signals.clear()  # as if the process had died before carrying out the effect

    for _ in range(3):
        world.clock.advance(minutes=1)
        world.reconciler.run()
    assert len(world.signaller.signals) == 1
    trainer_answers(world, job, 180)
    assert world.compute.instances[iid].state == "terminated"
    assert world.store.get(job.job_id).checkpoint_step == 180


def test_an_answered_stop_is_not_signalled_again_and_a_silent_trainer_is_signalled_at_a_bounded_rate(
    world: World,
) -> None:
    answered, answered_iid = idle_job_at_step_100(world, "msg-1")
    _silent, silent_iid = idle_job_at_step_100(world, "msg-2")
    world.reactions.idle_alarm(answered_iid)
    world.reactions.idle_alarm(silent_iid)
    trainer_answers(world, answered, 150)
    world.signaller.signals.clear()

    minutes = int(STOP_CHECKPOINT_DEADLINE.total_seconds() // 60)
    for _ in range(minutes - 1):
        world.clock.advance(minutes=1)
        world.reconciler.run()

    to_silent = [ids for ids, _ in world.signaller.signals if ids == (silent_iid,)]
    assert len(world.signaller.signals) == len(to_silent)  # none to the job whose commit came
    assert len(to_silent) == minutes // int(CHECKPOINT_RESEND_INTERVAL.total_seconds() // 60) - 1
    assert world.compute.instances[silent_iid].state == "running"  # still waiting for its commit

    # at the deadline the silent trainer's stop is carried out with what it has, and no more signals
    world.clock.advance(minutes=1)
    world.reconciler.run()
    assert world.compute.instances[silent_iid].state == "terminated"
    sent = len(world.signaller.signals)
    world.clock.advance(minutes=5)
    world.reconciler.run()
    assert len(world.signaller.signals) == sent


def test_a_job_that_takes_no_checkpoint_requests_is_never_sent_one(world: World) -> None:
    job = world.submit(spec(checkpoint="directory")).job
    (iid,) = job.instance_ids
    world.reactions.request_stop(job.job_id, Reason.MAX_RUNTIME, detail="ran 61 min of 60")
    for _ in range(4):
        world.clock.advance(minutes=1)
        world.reconciler.run()
    assert world.signaller.signals == []
    assert world.compute.instances[iid].state == "terminated"  # its SIGTERM is what it saves on
