"""Issue 21: when spot reclaims one node of a gang, only that node is replaced.

The gang saves the warning's checkpoint; the survivors stay up (their generation tag raised), and a
replacement is launched into the survivors' pool and placement group with the attempt's own run
document and the next generation's tag. Same attempt, same world size. Where the pool has no room
for it (a reclaim is usually the pool shrinking), or nothing launches it in time, the whole gang is
replaced as before, the reclaim counted once.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpujobs.domain import regroup
from gpujobs.domain.job import Job, Market
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport
from gpujobs.domain.states import JobState, Reason
from gpujobs_fakes.faults import InjectedFaultError
from tests.service.conftest import World, dumped_then_killed, spec

GANG = {"nodes": 2, "instance_types": ["g5.xlarge"], "capacity": "spot-first"}


def running_gang(world: World, **overrides: object) -> Job:
    job = world.submit(spec(**{**GANG, **overrides})).job
    job = world.store.get(job.job_id)
    assert job.state is JobState.RUNNING
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=100))
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=100, uri="s3://ckpt-bucket/x/100"))
    return world.store.get(job.job_id)


def reasons(job: Job) -> list[Reason]:
    return [e.reason for e in job.history]


def test_one_reclaimed_node_is_replaced_into_the_gangs_pool_and_the_survivor_stays(world: World) -> None:
    job = running_gang(world)
    survivor, lost = job.instance_ids
    first = world.compute.calls[-1]

    world.reactions.spot_warning(lost)

    after = world.store.get(job.job_id)
    attempt = after.current_attempt
    assert attempt is not None
    assert after.state is JobState.RUNNING
    assert [a.number for a in after.attempts] == [1]  # the same attempt: its keys, session and group
    assert attempt.instance_ids[0] == survivor
    assert lost not in attempt.instance_ids
    assert len(attempt.instance_ids) == 2  # the same world size
    (replacement,) = attempt.instance_ids[1:]
    assert attempt.generation == 1
    assert attempt.left == (lost,)
    assert reasons(after)[-2:] == [Reason.NODE_RECLAIMED, Reason.NODE_REPLACED]
    assert after.interruptions == 1
    call = world.compute.calls[-1]
    assert (call.count, call.instance_type, call.subnet, call.market) == (1, "g5.xlarge", first.subnet, Market.SPOT)
    assert call.placement_group == first.placement_group == f"gpujobs-{job.job_id}-a1"
    assert call.generation == 1
    assert call.attempt == 1
    assert json_user_data_of(call.user_data)["attempt"] == 1
    assert world.compute.instances[survivor].state == "running"  # never terminated, never relaunched
    assert world.compute.instances[survivor].instance.generation == 1  # told to rendezvous again
    assert world.compute.instances[replacement].instance.generation == 1
    assert any(set(ids) == {survivor, lost} for ids, _ in world.signaller.signals)  # the gang saves first


def json_user_data_of(user_data: str | bytes) -> dict[str, object]:
    import json

    doc: dict[str, object] = json.loads(user_data)
    return doc


def test_the_regrouped_gang_finishes_and_the_lost_nodes_events_change_nothing(world: World) -> None:
    job = running_gang(world)
    survivor, lost = job.instance_ids
    world.reactions.spot_warning(lost)
    world.reactions.spot_warning(lost)  # EventBridge delivers twice
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, exit_code=75, instance_id=lost))  # it saved
    world.compute.instances[lost].state = "terminated"
    world.reactions.instance_state(lost, "terminated")
    world.clock.advance(minutes=10)
    world.reconciler.run()

    regrouped = world.store.get(job.job_id)
    assert regrouped.state is JobState.RUNNING
    assert regrouped.interruptions == 1
    assert len([c for c in world.compute.calls if c.generation == 1]) == 1  # launched once
    for rank in range(2):
        world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, exit_code=0, node_rank=rank))
    done = world.store.get(job.job_id)
    assert done.state is JobState.SUCCEEDED
    assert survivor in done.attempts[0].instance_ids


def test_no_room_in_the_gangs_pool_replaces_the_whole_gang_counting_the_reclaim_once(world: World) -> None:
    job = running_gang(world)
    survivor, lost = job.instance_ids
    first = job.current_attempt
    assert first is not None
    world.compute.refuse[("g5.xlarge", first.zone or "", "spot")] = "InsufficientInstanceCapacity"

    world.reactions.spot_warning(lost)

    after = world.store.get(job.job_id)
    assert reasons(after)[-4:] == [
        Reason.NODE_RECLAIMED,
        Reason.NO_ROOM_FOR_NODE,
        Reason.REPLACEMENT_LAUNCHING,
        Reason.INSTANCES_LAUNCHED,
    ]
    assert after.interruptions == 1
    reclaimed, whole = after.attempts
    assert reclaimed.interrupted_at is not None
    assert reclaimed.tries[-1].error_code == "InsufficientInstanceCapacity"
    assert len(whole.instance_ids) == 2
    assert whole.zone != reclaimed.zone
    world.clock.advance(minutes=6)  # past the warning window and the grace: the survivor is taken
    world.reconciler.run()
    assert world.compute.instances[survivor].state == "terminated"


def warned_as_run_instances_fails(world: World, instance_id: str, why: str) -> None:
    """The warning's handler dies at its RunInstances (a timeout, throttling): the regroup is recorded, not launched."""

    def crash(_request: object) -> None:
        raise InjectedFaultError(why)

    world.compute.on_run = crash
    with pytest.raises(InjectedFaultError):
        world.reactions.spot_warning(instance_id)
    world.compute.on_run = None


def test_a_launch_lost_with_its_handler_is_launched_by_the_reconciler(world: World) -> None:
    job = running_gang(world)
    _, lost = job.instance_ids
    warned_as_run_instances_fails(world, lost, "the spot function timed out before RunInstances")
    assert regroup.pending_regroup(world.store.get(job.job_id)) is not None

    world.clock.advance(minutes=1)
    world.reconciler.run()

    after = world.store.get(job.job_id)
    assert after.state is JobState.RUNNING
    assert len(after.instance_ids) == 2
    assert lost not in after.instance_ids


def test_a_replacement_not_launched_in_time_gives_the_regroup_up(world: World) -> None:
    job = running_gang(world)
    _, lost = job.instance_ids
    warned_as_run_instances_fails(world, lost, "RunInstances throttled")
    world.clock.advance(seconds=regroup.LAUNCH_LIMIT.total_seconds())
    report = world.reconciler.run()

    after = world.store.get(job.job_id)
    assert report.repairs["regroups whose replacement was not launched in time"] == 1
    assert Reason.NO_ROOM_FOR_NODE in reasons(after)
    assert [a.number for a in after.attempts] == [1, 2]
    assert len(after.attempts[1].instance_ids) == 2


def test_a_second_warning_while_the_gang_waits_replaces_the_whole_gang(world: World) -> None:
    job = running_gang(world, nodes=3)
    _a, b, c = job.instance_ids

    warned_as_run_instances_fails(world, c, "not launched yet")
    world.reactions.spot_warning(b)

    after = world.store.get(job.job_id)
    assert [x.number for x in after.attempts] == [1, 2]
    assert len(after.attempts[1].instance_ids) == 3
    assert after.interruptions == 2


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"checkpoint": "directory"}, "the survivors of a script without the library do not save and wait"),
        ({"capacity": "spot", "max_interruptions": 0}, "a spot job past its limit fails as before"),
        ({"nodes": 1}, "a single node"),
    ],
)
def test_jobs_that_cannot_regroup_are_replaced_whole(world: World, overrides: dict[str, object], why: str) -> None:
    job = running_gang(world, **overrides)

    world.reactions.spot_warning(job.instance_ids[-1])

    after = world.store.get(job.job_id)
    assert Reason.NODE_RECLAIMED not in reasons(after), why
    assert all(c.generation == 0 for c in world.compute.calls), why


def test_a_regrouped_gang_is_timed_like_a_new_one_and_one_that_never_heartbeats_is_a_hang(world: World) -> None:
    job = running_gang(world)  # its last heartbeat is now
    trainer = job.require_spec().trainer
    world.clock.advance(seconds=(trainer.heartbeat_overdue - timedelta(minutes=2)).total_seconds())
    world.reactions.spot_warning(job.instance_ids[-1])
    gang = world.store.get(job.job_id).instance_ids

    world.clock.advance(minutes=5)  # past the old heartbeat's limit, while the gang reboots
    world.reconciler.run()
    assert all(world.compute.instances[i].state == "running" for i in gang)

    world.clock.advance(seconds=(trainer.first_heartbeat - timedelta(minutes=4)).total_seconds())
    dumped_then_killed(world)  # a hang: its stacks are asked for, then it is killed
    assert all(world.compute.instances[i].state == "terminated" for i in gang)


def test_three_node_reclaims_in_six_hours_send_the_third_to_on_demand(world: World) -> None:
    job = running_gang(world)
    for hour in range(3):
        current = world.store.get(job.job_id)
        world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=200 + hour))
        world.reactions.spot_warning(current.instance_ids[-1])
        world.clock.advance(hours=1)
        world.reconciler.run()

    after = world.store.get(job.job_id)
    assert reasons(after).count(Reason.NODE_RECLAIMED) == 2  # the third made spot volatile for it
    assert after.current_attempt is not None
    assert after.current_attempt.market is Market.ON_DEMAND
    assert after.interruptions == 3


def test_a_budget_hold_gives_the_regroup_up_and_holds_the_whole_gang(world: World) -> None:
    from gpujobs.domain.budget import BudgetMode, BudgetPolicy

    job = running_gang(world)
    world.budgets.set_policy(BudgetPolicy(scope="default", mode=BudgetMode.HOLD, since=world.clock.now()))

    world.reactions.spot_warning(job.instance_ids[-1])

    after = world.store.get(job.job_id)
    assert Reason.NO_ROOM_FOR_NODE in reasons(after)
    assert all(c.generation == 0 for c in world.compute.calls)
    assert after.state in (JobState.QUEUED, JobState.INTERRUPTED)
    assert after.interruptions == 1  # the reclaim is still the job's one interruption


def test_a_node_that_left_the_gang_is_spared_while_it_saves_and_taken_if_spot_does_not(world: World) -> None:
    job = running_gang(world)
    _, lost = job.instance_ids
    world.clock.advance(hours=1)  # an hour into training
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=160))
    world.reactions.spot_warning(lost)

    world.clock.advance(minutes=2)  # its save may still run: the warning's window
    world.reconciler.run()
    assert world.compute.instances[lost].state == "running"

    world.clock.advance(seconds=regroup.LAUNCH_LIMIT.total_seconds())  # spot never took it
    world.reconciler.run()
    assert world.compute.instances[lost].state == "terminated"
    after = world.store.get(job.job_id)
    assert after.state is JobState.RUNNING
    assert all(world.compute.instances[i].state == "running" for i in after.instance_ids)


def test_a_gang_an_older_release_launched_is_replaced_whole(world: World) -> None:
    """Its instances run that release's bootstrap, which would never rendezvous again."""
    job = running_gang(world)
    attempt = job.current_attempt
    assert attempt is not None
    assert attempt.can_regroup  # what this release records
    older = world.store.save(job.with_attempt(attempt.model_copy(update={"can_regroup": False}), now=job.updated_at))

    world.reactions.spot_warning(older.instance_ids[-1])

    after = world.store.get(job.job_id)
    assert Reason.NODE_RECLAIMED not in reasons(after)
    assert [a.number for a in after.attempts] == [1, 2]


def test_a_stop_while_the_gang_waits_for_its_replacement_launches_none_and_stops_the_survivors(world: World) -> None:
    job = running_gang(world)
    survivor, lost = job.instance_ids
    warned_as_run_instances_fails(world, lost, "RunInstances throttled")
    world.reactions.request_stop(job.job_id, Reason.IDLE, detail="GPUs idle")
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=101, uri="s3://ckpt-bucket/x/101"))

    world.clock.advance(minutes=10)
    world.reconciler.run()

    after = world.store.get(job.job_id)
    assert after.state is JobState.STOPPED
    assert not [c for c in world.compute.instances.values() if c.request.generation]  # no replacement launched
    assert world.compute.instances[survivor].state in ("terminated", "stopped")


def test_a_replacement_launched_but_never_recorded_goes_once_the_regroup_is_given_up(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the randomized proof: the replacement's RunInstances succeeded, its record did not, and
    nothing could adopt it (DescribeInstances failing) before the regroup was given up. The whole
    gang was replaced, and the unrecorded replacement ran beside it for as long as its old attempt
    kept a node up."""
    from gpujobs.service.sweeps import ORPHAN_GRACE

    job = running_gang(world)
    _, lost = job.instance_ids
    world.compute.on_run = lambda _request: world.store.faults.fail_next("save")  # its record is lost
    with pytest.raises(InjectedFaultError):
        world.reactions.spot_warning(lost)
    world.compute.on_run = None
    [unrecorded] = [i for i, f in world.compute.instances.items() if f.request.generation == 1]
    assert unrecorded not in world.store.get(job.job_id).instance_ids
    find = world.compute.find_instances

    def describe_failing_for_attempt_1(*, job_id: str, attempt: int | None = None) -> object:
        if attempt == 1:
            raise InjectedFaultError("DescribeInstances throttled")
        return find(job_id=job_id, attempt=attempt)

    monkeypatch.setattr(world.compute, "find_instances", describe_failing_for_attempt_1)

    world.clock.advance(seconds=regroup.LAUNCH_LIMIT.total_seconds())
    world.reconciler.run()  # the regroup is given up: the whole gang is replaced
    after = world.store.get(job.job_id)
    assert after.current_attempt is not None
    assert after.current_attempt.number == 2
    world.clock.advance(seconds=(ORPHAN_GRACE - regroup.LAUNCH_LIMIT).total_seconds() + 60)
    world.reconciler.run()

    assert world.compute.instances[unrecorded].state == "terminated"
    assert all(world.compute.instances[i].state == "running" for i in world.store.get(job.job_id).instance_ids)
