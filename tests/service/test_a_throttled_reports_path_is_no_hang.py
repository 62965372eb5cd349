"""Heartbeats held back by a throttled Reports function never turn into "hung" verdicts (issue 18).

Silence is counted from the later of the last heartbeat and the last minute the Reports function was
throttled (`domain.hangs`): a flood from one job, or the account's concurrency spent elsewhere,
delays every trainer's heartbeats, and no other job's gang is replaced for it. Simulated time only.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpujobs.domain.hangs import hang_of
from gpujobs.domain.job import Job
from gpujobs.domain.reports import HeartbeatReport
from gpujobs.domain.states import JobState
from tests.service.conftest import World, dumped_then_killed, spec

HUNG = "hung attempts terminated"


def heartbeating(world: World, name: str = "train") -> Job:
    job = world.submit(spec(name=name), message_id=f"m-{name}").job
    assert job.state is JobState.RUNNING
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=10))
    return world.store.get(job.job_id)


def test_silence_while_reports_were_throttled_is_no_hang_and_a_real_hang_is_still_judged(world: World) -> None:
    job = heartbeating(world)
    (iid,) = job.instance_ids
    throttled: list[datetime] = []
    world.rewire(reports_throttled_at=lambda now: max(throttled) if throttled else None)

    world.clock.advance(minutes=10)
    throttled.append(world.clock.now())  # its next heartbeats wait in Lambda's queue
    world.clock.advance(minutes=6)  # 16 minutes without a recorded heartbeat: past the 15-minute limit
    assert world.reconciler.run().repairs[HUNG] == 0
    assert iid not in world.compute.terminated

    world.clock.advance(minutes=10)  # 16 minutes since the last throttle, and still nothing came
    report = dumped_then_killed(world)

    assert report.repairs[HUNG] == 1
    assert iid in world.compute.terminated


def test_a_throttle_before_the_last_heartbeat_changes_nothing(world: World) -> None:
    job = heartbeating(world)
    throttled_at = world.clock.now() - timedelta(minutes=5)
    world.rewire(reports_throttled_at=lambda _now: throttled_at)

    world.clock.advance(minutes=16)

    assert dumped_then_killed(world).repairs[HUNG] == 1
    assert job.instance_ids[0] in world.compute.terminated


def test_an_unreadable_throttle_metric_judges_hangs_as_before(world: World) -> None:
    job = heartbeating(world)

    def refused(_now: datetime) -> datetime | None:
        raise PermissionError("AccessDenied: cloudwatch:GetMetricStatistics")

    world.rewire(reports_throttled_at=refused)
    world.clock.advance(minutes=16)

    assert dumped_then_killed(world).repairs[HUNG] == 1
    assert job.instance_ids[0] in world.compute.terminated


def test_the_metric_is_read_once_per_tick_and_not_at_all_without_a_running_job(world: World) -> None:
    reads: list[datetime] = []

    def throttles(now: datetime) -> datetime | None:
        reads.append(now)
        return None

    world.rewire(reports_throttled_at=throttles)
    world.reconciler.run()
    assert reads == []

    for name in ("a", "b", "c"):
        heartbeating(world, name)
    world.reconciler.run()
    assert reads == [world.clock.now()]


def test_the_first_heartbeat_limit_also_counts_from_the_last_throttle(world: World) -> None:
    job = world.submit(spec()).job
    started = world.clock.now()
    limit = job.require_spec().trainer.first_heartbeat
    after_throttle = started + timedelta(minutes=20)

    assert hang_of(job, now=started + limit, reports_throttled_at=None) is not None
    assert hang_of(job, now=started + limit, reports_throttled_at=after_throttle) is None
    hang = hang_of(job, now=after_throttle + limit, reports_throttled_at=after_throttle)
    assert hang is not None
    assert "after the reports path was last throttled" in hang.why
