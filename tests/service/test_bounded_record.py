"""A job's record is one DynamoDB item, and an item cannot pass 400 KB.

Stories that only show after days: a job waiting a week for p5 capacity in 18 pools, a job
interrupted 100 times, a 64-node gang heartbeating for a week. The record keeps the newest history,
attempts and refusals plus counts of the rest, so each stays far under the limit; and a record that
would pass it anyway is refused by the in-memory store exactly as DynamoDB refuses it, with a typed
error. The clock is simulated: a week runs in seconds.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpujobs.adapters.dynamodb import MAX_ITEM_BYTES, item_size, job_item
from gpujobs.contract import MAX_HEARTBEAT_METRICS
from gpujobs.domain.cost import billed_pools, cost_of, runtime_of
from gpujobs.domain.job import MAX_DETAIL_CHARS, Job
from gpujobs.domain.ladder import next_try_delay
from gpujobs.domain.progress import MAX_PROGRESS_POINTS
from gpujobs.domain.regroup import MAX_LEFT_KEPT
from gpujobs.domain.reports import HeartbeatReport
from gpujobs.domain.states import JobState
from gpujobs.service.config import LaunchConfig
from gpujobs.service.ports import JobRecordTooLargeError, Subnet
from gpujobs_fakes.memory import FakeCompute
from tests.service.conftest import World, spec

FAR_UNDER = MAX_ITEM_BYTES // 4
"""What "far under the limit" means here: a quarter of it, leaving room for a spec of 256 KB."""
P5_TYPES = ("p5.48xlarge", "p5e.48xlarge", "p4d.24xlarge")
ZONES = tuple(f"us-east-1{z}" for z in "abcdef")


def ec2_capacity_message(instance_type: str, zone: str) -> str:
    """EC2's own wording for InsufficientInstanceCapacity, about 300 characters."""
    others = ", ".join(z for z in ZONES if z != zone)
    return (
        f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested"
        f" ({zone}). Our system will be working on provisioning additional capacity. You can currently get"
        f" {instance_type} capacity by not specifying an Availability Zone in your request or choosing {others}."
    )


class NoCapacity(FakeCompute):
    """EC2 with no capacity anywhere, answering every rung with its real, long message."""

    def run_instances(self, request):  # type: ignore[no-untyped-def]
        if self.refuse.get((request.instance_type, request.subnet.zone, request.market.value)):
            from gpujobs.service.ports import CapacityError

            self.calls.append(request)
            raise CapacityError(
                "InsufficientInstanceCapacity", ec2_capacity_message(request.instance_type, request.subnet.zone)
            )
        return super().run_instances(request)


def size_of(job: Job) -> int:
    return item_size(job_item(job))


@pytest.fixture
def p5_world() -> World:
    world = World()
    world.compute = NoCapacity(subnet_list=[Subnet(f"subnet-{z[-1]}", z) for z in ZONES], clock=world.clock)
    world.compute.refuse = {
        (t, z, m): "InsufficientInstanceCapacity" for t in P5_TYPES for z in ZONES for m in ("spot", "on-demand")
    }
    world.rewire(
        compute=world.compute,
        config=LaunchConfig(
            checkpoint_bucket="ckpt-bucket",
            event_bus_name="gpujobs-jobs",
            region="us-east-1",
            allowed_instance_types=P5_TYPES,
        ),
    )
    return world


def test_a_week_waiting_for_p5_capacity_in_18_pools_keeps_the_record_far_under_400_kb(p5_world: World) -> None:
    world = p5_world
    job_id = world.submit(spec(instance_types=list(P5_TYPES), gpus_per_node=8)).job.job_id
    week_end = world.clock.now() + timedelta(days=7)

    walks = 1
    while world.clock.now() < week_end:
        job = world.store.get(job_id)
        assert job.state is JobState.QUEUED
        assert job.next_try_at is not None
        world.clock.current = job.next_try_at
        world.reconciler.run()
        walks += 1

    job = world.store.get(job_id)
    assert walks > 300  # a walk of 36 refused rungs at least every half hour
    assert len(world.compute.calls) == walks * 36
    assert size_of(job) < FAR_UNDER
    assert job.attempt_count == walks
    assert job.history_count == 1 + 2 * walks  # submitted, then launch-started and no-capacity per walk
    latest = job.current_attempt
    assert latest is not None
    assert latest.tries_dropped + len(latest.tries) == 36
    assert latest.tries[-1].message == ec2_capacity_message(latest.tries[-1].instance_type, latest.tries[-1].zone)
    assert all(len(entry.detail) <= MAX_DETAIL_CHARS for entry in job.history)
    # Retired attempts still count as failures in a row: the retry backoff stays at its ceiling.
    assert job.next_try_at is not None
    assert job.next_try_at - world.clock.now() == next_try_delay(10, jitter=0.5)

    world.compute.refuse = {}
    world.clock.current = job.next_try_at or world.clock.now()
    world.reconciler.run()
    running = world.store.get(job_id)
    assert running.state is JobState.RUNNING
    assert running.attempt_count == walks + 1
    assert [e.target for e in world.publisher.events if e.job_id == job_id][-1] is JobState.RUNNING


def test_a_job_interrupted_100_times_keeps_a_bounded_record_and_still_counts_its_runtime(world: World) -> None:
    # a `directory` script's gang is replaced whole at each warning (it cannot regroup: `domain.regroup`)
    job_id = world.submit(spec(nodes=2, max_interruptions=100, checkpoint="directory")).job.job_id

    for _ in range(100):
        world.clock.advance(hours=1)
        job = world.store.get(job_id)
        old = job.instance_ids
        world.reactions.spot_warning(old[0])
        world.clock.advance(minutes=2)
        for iid in old:
            world.compute.terminate([iid])
            world.reactions.instance_state(iid, "terminated")

    job = world.store.get(job_id)
    assert job.state is JobState.RUNNING
    assert job.interruptions == 100
    assert job.attempt_count == 101
    assert size_of(job) < FAR_UNDER
    # Attempts that left the record still count towards the caps: 100 attempts of an hour or more,
    # each of 2 instances at $0.50 an hour on spot.
    assert runtime_of(job, world.clock.now()) >= timedelta(hours=100)
    prices = {
        pool: world.prices.hourly_usd(instance_type=pool.instance_type, market=pool.market, zone=pool.zone)
        for pool in billed_pools(job)
    }
    assert cost_of(job, world.clock.now(), prices) >= 100 * 2 * 0.5
    published = [e for e in world.publisher.events if e.job_id == job_id]
    assert sum(1 for e in published if e.target is JobState.INTERRUPTED) == 100


def test_a_gang_that_regroups_100_times_keeps_a_bounded_record_and_pays_for_every_node(world: World) -> None:
    job_id = world.submit(spec(nodes=2, instance_types=["g5.xlarge"])).job.job_id

    for regroups in range(100):
        world.clock.advance(hours=4)  # 25 reclaims a week never make spot volatile for it
        job = world.store.get(job_id)
        world.reactions.report(HeartbeatReport(job_id=job_id, attempt=1, step=regroups + 1))
        lost = job.instance_ids[-1]
        world.reactions.spot_warning(lost)
        world.compute.terminate([lost])
        world.reactions.instance_state(lost, "terminated")

    job = world.store.get(job_id)
    attempt = job.current_attempt
    assert attempt is not None
    assert job.state is JobState.RUNNING
    assert job.attempt_count == 1
    assert attempt.generation == 100
    assert job.interruptions == 100
    assert len(attempt.instance_ids) == 2
    assert len(attempt.left) == MAX_LEFT_KEPT
    assert size_of(job) < FAR_UNDER
    prices = {
        pool: world.prices.hourly_usd(instance_type=pool.instance_type, market=pool.market, zone=pool.zone)
        for pool in billed_pools(job)
    }
    assert cost_of(job, world.clock.now(), prices) == pytest.approx(400 * 2 * 0.5)  # two nodes, all along


def test_a_64_node_gang_heartbeating_for_a_week_keeps_the_size_it_had_on_day_one(world: World) -> None:
    job_id = world.submit(spec(nodes=64, instance_types=["p4d.24xlarge"], gpus_per_node=8)).job.job_id
    world.reactions.report(HeartbeatReport(job_id=job_id, attempt=1, step=1))
    day_one = size_of(world.store.get(job_id))

    for step in range(2, 7 * 24 * 12):  # every five minutes for a week
        world.clock.advance(minutes=5)
        world.reactions.report(HeartbeatReport(job_id=job_id, attempt=1, step=step))

    job = world.store.get(job_id)
    assert job.state is JobState.RUNNING
    assert size_of(job) <= day_one + 16  # only the heartbeat's time and step change
    assert size_of(job) < FAR_UNDER


def test_the_in_memory_store_refuses_a_record_over_400_kb_as_dynamodb_counts_it(world: World) -> None:
    job = world.store.get(world.submit(spec()).job.job_id)
    bloated = job.model_copy(update={"submission_excerpt": "x" * MAX_ITEM_BYTES})

    with pytest.raises(JobRecordTooLargeError) as refused:
        world.store.save(bloated)
    with pytest.raises(JobRecordTooLargeError):
        world.store.create(bloated.model_copy(update={"job_id": "j-other"}))

    assert refused.value.size == size_of(bloated.model_copy(update={"version": job.version + 1}))
    assert refused.value.size > MAX_ITEM_BYTES
    assert world.store.get(job.job_id) == job  # nothing was written


def test_a_refused_record_is_an_error_the_reconciler_counts_each_tick_not_a_retry_loop(world: World) -> None:
    job_id = world.submit(spec(nodes=2)).job.job_id
    saves: list[int] = []
    original = world.store.save

    def refusing_save(job: Job) -> Job:
        saves.append(job.version)
        raise JobRecordTooLargeError(job.job_id, MAX_ITEM_BYTES + 1, MAX_ITEM_BYTES)

    world.compute.terminate(list(world.store.get(job_id).instance_ids))  # the gang is gone: a repair is due
    world.store.save = refusing_save  # type: ignore[method-assign]
    report = world.reconciler.run()
    world.store.save = original  # type: ignore[method-assign]

    assert report.repairs["errors"] == 1
    assert len(saves) == 1  # refused once, not retried as if it were a lost race


def test_a_week_of_heartbeats_with_every_metric_keeps_a_bounded_series_far_under_400_kb(world: World) -> None:
    job_id = world.submit(spec(nodes=64, instance_types=["p4d.24xlarge"], gpus_per_node=8)).job.job_id
    longest_names = [f"{'m' * 31}{i}" for i in range(MAX_HEARTBEAT_METRICS)]  # 32 characters, the most allowed

    heartbeats = 7 * 24 * 12  # every five minutes for a week
    for step in range(1, heartbeats + 1):
        world.clock.advance(minutes=5)
        metrics = tuple((name, 1 / (step + i + 7)) for i, name in enumerate(longest_names))  # 6+ digits each
        world.reactions.report(
            HeartbeatReport(
                job_id=job_id, attempt=1, step=step, metrics=metrics, steps_per_second=1 / 3, samples_per_second=1 / 7
            )
        )

    job = world.store.get(job_id)
    assert len(job.progress.points) == MAX_PROGRESS_POINTS
    assert job.progress.dropped == heartbeats - MAX_PROGRESS_POINTS
    assert [p.step for p in job.progress.points] == list(range(heartbeats - MAX_PROGRESS_POINTS + 1, heartbeats + 1))
    assert size_of(job) < FAR_UNDER
