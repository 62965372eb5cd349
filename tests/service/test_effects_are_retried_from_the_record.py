"""Stories where a port call fails once: the record still gets its way (level-triggered effects).

The store write comes first and says what should be true; an effect that fails after it (a
Terminate, a Stop, an alarm call) is issued again by the next event or reconciler tick, and a
state change is published whatever happens to the effects that follow it.
"""

from __future__ import annotations

import pytest

from gpujobs.domain.job import Job
from gpujobs.domain.reports import CheckpointReport, ExitReport
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, spec


def running(world: World, **overrides: object) -> Job:
    job = world.submit(spec(**overrides)).job
    assert job.state is JobState.RUNNING
    return job


def only_instance(world: World, job: Job) -> str:
    (iid,) = world.store.get(job.job_id).instance_ids
    return iid


# ---- scenario 3: a policy stop is carried out even if Terminate/Stop fails once ---------------------


@pytest.mark.parametrize(
    ("capacity", "call", "end_state"), [("spot", "terminate", "terminated"), ("on-demand", "stop", "stopped")]
)
def test_a_policy_stop_is_carried_out_even_if_its_terminate_or_stop_fails_once(
    world: World, capacity: str, call: str, end_state: str
) -> None:
    job = running(world, capacity=capacity)
    iid = only_instance(world, job)
    world.reactions.idle_alarm(iid)

    # when the checkpoint arrives but the call that takes the instances fails
    world.compute.faults.fail_next(call)
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=7, uri="s3://b/step-7"))
    assert world.compute.instances[iid].state == "running"

    # then the reconciler's next tick issues it again, from the record
    world.reconciler.run()
    assert world.compute.instances[iid].state == end_state
    world.reactions.instance_state(iid, end_state)
    stopped = world.store.get(job.job_id)
    assert stopped.state is JobState.STOPPED
    assert stopped.history[-1].reason is Reason.IDLE


def test_a_due_stop_is_issued_again_on_every_settle_while_its_instances_live(world: World) -> None:
    job = running(world)
    iid = only_instance(world, job)
    world.reactions.request_stop(job.job_id, Reason.MAX_RUNTIME, detail="ran 61 min of 60")
    world.compute.faults.fail_next("terminate", times=2)
    world.clock.advance(minutes=11)  # past the checkpoint deadline

    world.reactions.settle(job.job_id)
    world.reactions.settle(job.job_id)
    assert world.compute.instances[iid].state == "running"
    world.reactions.settle(job.job_id)

    assert world.compute.instances[iid].state == "terminated"


# ---- scenario 11: stopped instances -----------------------------------------------------------------


def test_a_lost_stopped_event_is_repaired_and_the_stopped_instances_are_kept(world: World) -> None:
    job = running(world, capacity="on-demand")
    iid = only_instance(world, job)
    world.reactions.idle_alarm(iid)
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=5, uri="s3://b/step-5"))
    assert world.compute.instances[iid].state == "stopped"  # ... and the `stopped` event never comes

    world.reconciler.run()

    stopped = world.store.get(job.job_id)
    assert stopped.state is JobState.STOPPED
    assert stopped.history[-1].reason is Reason.IDLE

    # the stopped instance of a STOPPED job is kept on purpose, never swept as an orphan
    world.clock.advance(hours=2)
    world.reconciler.run()
    assert world.compute.instances[iid].state == "stopped"
    assert world.compute.terminated == []

    # until the user cancels the ended job
    world.service.cancel(job.job_id)
    assert world.compute.instances[iid].state == "terminated"


# ---- scenario 12: idle alarms never leak or go missing --------------------------------------------------


def test_cancelling_a_job_deletes_its_idle_alarms(world: World) -> None:
    job = running(world, nodes=2)
    assert len(world.alarms.alarms) == 2

    world.service.cancel(job.job_id)

    assert world.alarms.alarms == {}


def test_the_alarms_of_a_finished_job_are_deleted_even_if_the_first_delete_fails(world: World) -> None:
    job = running(world)
    iid = only_instance(world, job)
    world.alarms.faults.fail_next("delete")

    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=iid, exit_code=0))
    assert world.store.get(job.job_id).state is JobState.SUCCEEDED
    assert iid in world.alarms.alarms

    report = world.reconciler.run()

    assert world.alarms.alarms == {}
    assert report.repairs["idle alarms deleted"] == 1


def test_a_running_gpu_job_whose_alarms_are_missing_gets_them_back(world: World) -> None:
    world.alarms.faults.fail_next("create")
    job = running(world, nodes=2, idle={"gpu_util_below_percent": 4, "for_minutes": 15})
    cpu = world.submit(spec(gpus_per_node=0, instance_types=["c7i.large"]), message_id="m-cpu").job
    assert world.alarms.alarms == {}

    report = world.reconciler.run()

    nodes = world.store.get(job.job_id).instance_ids
    assert world.alarms.alarms == dict.fromkeys(nodes, (job.job_id, 4, 15))  # and none for the CPU job
    assert cpu.state is JobState.RUNNING
    assert report.repairs["idle alarms recreated"] == 2
    assert world.reconciler.run().repairs["idle alarms recreated"] == 0


def test_a_tick_that_cannot_list_the_alarms_still_repairs_everything_else(world: World) -> None:
    job = running(world, capacity="on-demand")
    world.compute.terminate([only_instance(world, job)])  # EC2 took it; the event never arrived
    world.alarms.faults.fail_next("instance_ids")

    report = world.reconciler.run()

    assert report.repairs["lost state changes repaired"] == 1
    assert report.repairs["errors"] == 0


# ---- scenario 13: every state change is published ------------------------------------------------------


def test_a_cancel_whose_terminate_fails_once_still_publishes_cancelled(world: World) -> None:
    job = running(world)
    iid = only_instance(world, job)
    world.compute.faults.fail_next("terminate")

    cancelled = world.service.cancel(job.job_id)

    assert cancelled.state is JobState.CANCELLED
    assert world.transitions(job.job_id)[-1] == ("RUNNING", "CANCELLED", "user-cancelled")
    # the instance the failed call left behind is swept by the reconciler, from the record
    world.clock.advance(minutes=11)
    world.reconciler.run()
    assert world.compute.instances[iid].state == "terminated"
