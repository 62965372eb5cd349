"""What a job's training reports as it runs lands on its record: the newest step, metrics and
throughput for `gpujobs status`, and a bounded series of them for `gpujobs metrics`.

Heartbeats come late, twice, out of order and rate-limited; each story checks what the series then
says. (The series' bound under a week of heartbeats: test_bounded_record.py.)
"""

from __future__ import annotations

from gpujobs.domain.effects import Outcome
from gpujobs.domain.reports import CheckpointReport, HeartbeatReport
from tests.service.conftest import World, spec


def beat(job_id: str, step: int, loss: float, *, attempt: int = 1, rate: float = 2.0) -> HeartbeatReport:
    return HeartbeatReport(
        job_id=job_id,
        attempt=attempt,
        step=step,
        metrics=(("loss", loss), ("lr", 0.001)),
        steps_per_second=rate,
        samples_per_second=rate * 64,
    )


def test_each_recorded_heartbeat_becomes_a_point_and_the_newest_is_the_jobs_live_progress(world: World) -> None:
    job_id = world.submit(spec()).job.job_id

    for step, loss in ((50, 2.1), (100, 1.4), (150, 0.9)):
        world.clock.advance(minutes=1)
        world.reactions.report(beat(job_id, step, loss))

    progress = world.store.get(job_id).progress
    assert [(p.step, p.metrics["loss"]) for p in progress.points] == [(50, 2.1), (100, 1.4), (150, 0.9)]
    latest = progress.latest
    assert latest is not None
    assert (latest.attempt, latest.step, latest.metrics) == (1, 150, {"loss": 0.9, "lr": 0.001})
    assert (latest.steps_per_second, latest.samples_per_second) == (2.0, 128.0)
    assert latest.at == world.clock.now()


def test_a_heartbeat_within_the_rate_limit_a_stale_one_and_a_replay_add_no_point(world: World) -> None:
    job_id = world.submit(spec()).job.job_id
    world.clock.advance(minutes=1)
    world.reactions.report(beat(job_id, 100, 1.4))

    limited = world.reactions.report(beat(job_id, 101, 1.3))  # the same second: not written
    world.clock.advance(minutes=1)
    stale = world.reactions.report(beat(job_id, 90, 1.5))  # delivered late, after step 100
    replay = world.reactions.report(beat(job_id, 100, 1.4))  # the same heartbeat again

    assert limited.outcome is Outcome.RATE_LIMITED
    assert stale.outcome is Outcome.NOT_NEWER
    assert replay.outcome is Outcome.HEARTBEAT_RECORDED
    assert [(p.step, p.metrics["loss"]) for p in world.store.get(job_id).progress.points] == [(100, 1.4)]


def test_a_keep_alive_at_the_same_step_updates_that_point_with_its_zero_rate(world: World) -> None:
    job_id = world.submit(spec()).job.job_id
    world.clock.advance(minutes=1)
    world.reactions.report(beat(job_id, 100, 1.4))
    world.clock.advance(minutes=1)
    world.reactions.report(beat(job_id, 100, 1.4, rate=0.0))  # inside run.busy("eval")

    (point,) = world.store.get(job_id).progress.points
    assert (point.step, point.steps_per_second, point.at) == (100, 0.0, world.clock.now())


def test_a_replacement_continues_the_series_from_its_checkpoint_under_its_own_attempt(world: World) -> None:
    job = world.submit(spec()).job
    world.clock.advance(minutes=1)
    world.reactions.report(beat(job.job_id, 120, 1.2))
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=100, uri="s3://c/step-00000100"))
    world.reactions.spot_warning(job.instance_ids[0])
    replacement = world.store.get(job.job_id).current_attempt
    assert replacement is not None
    assert replacement.number == 2

    world.clock.advance(minutes=1)
    world.reactions.report(beat(job.job_id, 110, 1.25, attempt=2))

    points = world.store.get(job.job_id).progress.points
    assert [(p.attempt, p.step) for p in points] == [(1, 120), (2, 110)]


def test_an_older_trainers_heartbeat_keeps_the_job_alive_and_adds_no_point(world: World) -> None:
    job_id = world.submit(spec()).job.job_id
    world.clock.advance(minutes=1)

    reaction = world.reactions.report(HeartbeatReport(job_id=job_id, attempt=1, step=100))

    job = world.store.get(job_id)
    assert reaction.outcome is Outcome.HEARTBEAT_RECORDED
    assert job.attempts[-1].heartbeat_step == 100
    assert job.progress.points == ()
