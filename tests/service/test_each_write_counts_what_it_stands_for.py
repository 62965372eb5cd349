"""A launch through the control plane counts, by pool, every capacity refusal of its ladder walk and
the launch itself; the job's end counts its estimated cost for its team. The counting rides on the
one write path (`change()`), so it needs nothing from the decisions, and a failing recorder never
fails the write."""

from __future__ import annotations

from collections.abc import Sequence

from gpujobs.domain.job_metrics import CAPACITY_REFUSALS, LAUNCHES, TEAM_COST, JobMetric
from gpujobs.domain.reports import ExitReport
from gpujobs.domain.states import JobState
from gpujobs_fakes.memory import TablePrices
from tests.service.conftest import World, spec


class RecordingMetrics:
    def __init__(self) -> None:
        self.recorded: list[JobMetric] = []

    def record(self, metrics: Sequence[JobMetric]) -> None:
        self.recorded += metrics


class BrokenMetrics:
    def record(self, metrics: Sequence[JobMetric]) -> None:
        raise RuntimeError("CloudWatch is down")


def counted(world: World, recorder: object) -> World:
    prices = TablePrices({("g5.xlarge", "spot"): 0.5, ("g5.xlarge", "on-demand"): 1.0, ("g6.xlarge", "on-demand"): 0.8})
    return world.rewire(metrics=recorder, prices=prices)


def test_a_launch_counts_the_refused_pools_and_the_one_that_launched(world: World) -> None:
    metrics = RecordingMetrics()
    counted(world, metrics)
    for zone in ("us-east-1a", "us-east-1b"):
        world.compute.refuse[("g5.xlarge", zone, "spot")] = "InsufficientInstanceCapacity"

    job = world.submit(spec(team="vision")).job
    launched = world.service.launch(job.job_id)

    assert launched.state is JobState.RUNNING
    refusals = [m for m in metrics.recorded if m.name == CAPACITY_REFUSALS]
    assert [dict(m.dimensions) for m in refusals] == [{"InstanceType": "g5.xlarge", "Market": "spot"}] * 2
    [launch] = [m for m in metrics.recorded if m.name == LAUNCHES]
    assert dict(launch.dimensions) == {"InstanceType": launched.current_attempt.instance_type, "Market": "spot"}  # type: ignore[union-attr]


def test_the_end_of_a_job_counts_its_cost_for_its_team(world: World) -> None:
    metrics = RecordingMetrics()
    counted(world, metrics)
    job = world.service.launch(world.submit(spec(team="vision")).job.job_id)
    (instance,) = job.instance_ids

    world.clock.advance(hours=2)
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, exit_code=0, instance_id=instance))

    assert world.store.get(job.job_id).state is JobState.SUCCEEDED
    [cost] = [m for m in metrics.recorded if m.name == TEAM_COST]
    assert dict(cost.dimensions) == {"Team": "vision"}
    assert cost.value > 0


def test_a_recorder_that_fails_never_fails_the_write(world: World) -> None:
    counted(world, BrokenMetrics())

    job = world.service.launch(world.submit(spec()).job.job_id)

    assert world.store.get(job.job_id).state is JobState.RUNNING
