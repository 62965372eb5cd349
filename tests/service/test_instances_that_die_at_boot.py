"""An instance that dies before its bootstrap reports is not a spot interruption: an account whose
default EBS key the instances may not use kills every launch at boot, and such a job must fail
saying so after a couple of attempts, not be relaunched as if reclaimed (issue 17: ~8 times)."""

from __future__ import annotations

from gpujobs.domain.fate import BOOT_DEATH_LIMIT, BOOT_WINDOW, REPORT_GRACE
from gpujobs.domain.reports import HeartbeatReport
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, spec

KMS_DEATH = "Client.InternalError: Client error on launch"


def die_at_boot(world: World, job_id: str) -> None:
    """EC2 ends the current attempt's instances at once, saying why; nothing was ever reported."""
    attempt = world.store.get(job_id).current_attempt
    assert attempt is not None
    world.compute.terminate(attempt.instance_ids)
    for iid in attempt.instance_ids:
        world.compute.state_reasons[iid] = KMS_DEATH
        world.reactions.instance_state(iid, "terminated")
    world.clock.advance(seconds=REPORT_GRACE.total_seconds() + 1)
    world.reconciler.run()  # settles after the grace and launches what is due


def test_a_spot_job_whose_instances_die_at_boot_fails_after_two_attempts_saying_why(world: World) -> None:
    job_id = world.submit(spec(capacity="spot", max_interruptions=8)).job.job_id

    die_at_boot(world, job_id)
    relaunched = world.store.get(job_id)
    assert relaunched.state is JobState.RUNNING
    assert relaunched.current_attempt is not None
    assert relaunched.current_attempt.number == 2
    assert relaunched.interruptions == 0  # not a reclaim
    assert [e.reason for e in relaunched.history if e.reason is Reason.DIED_AT_BOOT] == [Reason.DIED_AT_BOOT]

    die_at_boot(world, job_id)
    failed = world.store.get(job_id)

    assert BOOT_DEATH_LIMIT == 2
    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.DIED_AT_BOOT
    assert "died at boot, before the bootstrap's first report" in failed.status_detail
    assert f"EC2 said {failed.attempts[-1].instance_ids[0]}: {KMS_DEATH}" in failed.status_detail
    for cause in ("EBS", "KMS", "AMI", "instance profile"):
        assert cause in failed.status_detail
    assert len(world.compute.calls) == 2
    assert world.compute.live() == []
    assert failed.interruptions == 0


def test_a_death_at_boot_is_judged_the_same_whichever_handler_or_how_often(world: World) -> None:
    job_id = world.submit(spec(capacity="spot")).job.job_id
    (iid,) = world.store.get(job_id).instance_ids
    world.compute.terminate([iid])
    world.compute.state_reasons[iid] = KMS_DEATH
    world.reactions.instance_state(iid, "shutting-down")
    world.reactions.instance_state(iid, "terminated")  # a second event, then the reconciler, then a settle
    world.clock.advance(seconds=REPORT_GRACE.total_seconds() + 1)
    world.reconciler.run()
    once = world.store.get(job_id)
    world.reactions.settle(job_id)
    world.reactions.instance_state(iid, "terminated")

    again = world.store.get(job_id)
    assert [e.reason for e in again.history].count(Reason.DIED_AT_BOOT) == 1
    assert again.attempt(1) == once.attempt(1)
    assert again.attempt(1).end_reason == "died-at-boot"  # type: ignore[union-attr]


def test_an_attempt_that_reported_before_it_vanished_is_an_interruption_not_a_death_at_boot(world: World) -> None:
    job_id = world.submit(spec(capacity="spot")).job.job_id
    for _ in range(3):
        attempt = world.store.get(job_id).current_attempt
        assert attempt is not None
        world.reactions.report(HeartbeatReport(job_id=job_id, attempt=attempt.number, step=1))
        die_at_boot(world, job_id)

    job = world.store.get(job_id)
    assert job.state is JobState.RUNNING
    assert job.interruptions == 3
    assert Reason.DIED_AT_BOOT not in [e.reason for e in job.history]


def test_instances_that_vanish_silently_after_the_boot_window_are_an_interruption(world: World) -> None:
    job_id = world.submit(spec(capacity="spot")).job.job_id
    world.clock.advance(seconds=BOOT_WINDOW.total_seconds() + 60)  # booted, trains, never reports steps

    die_at_boot(world, job_id)

    job = world.store.get(job_id)
    assert job.interruptions == 1
    assert Reason.DIED_AT_BOOT not in [e.reason for e in job.history]


def test_deaths_at_boot_count_only_in_a_row(world: World) -> None:
    job_id = world.submit(spec(capacity="spot", max_interruptions=8)).job.job_id
    die_at_boot(world, job_id)
    attempt = world.store.get(job_id).current_attempt
    assert attempt is not None
    world.reactions.report(HeartbeatReport(job_id=job_id, attempt=attempt.number, step=1))
    die_at_boot(world, job_id)  # this one had booted: a reclaim, which breaks the row
    world.clock.advance(minutes=5)
    world.reconciler.run()
    die_at_boot(world, job_id)

    job = world.store.get(job_id)
    assert job.state is JobState.RUNNING
    assert [e.reason for e in job.history].count(Reason.DIED_AT_BOOT) == 2
    assert job.interruptions == 1


def test_an_on_demand_death_at_boot_is_not_a_crash_against_max_attempts(world: World) -> None:
    job_id = world.submit(spec(capacity="on-demand", max_attempts=1)).job.job_id

    die_at_boot(world, job_id)

    job = world.store.get(job_id)
    assert job.state is JobState.RUNNING  # relaunched once; max_attempts counts crashes, not boot deaths
    assert job.crashes == 0
    assert job.current_attempt is not None
    assert job.current_attempt.number == 2


def test_an_attempt_still_being_reclaimed_breaks_the_row_of_deaths_at_boot(world: World) -> None:
    """Found by the randomized proof: attempt 1 died at boot, attempt 2 got a spot warning (so it
    booted) and its replacement, attempt 3, died at boot while attempt 2 was still being reclaimed.
    Attempt 2 is no death at boot: the job relaunches instead of FAILING died-at-boot."""
    job_id = world.submit(spec(capacity="spot", max_interruptions=8)).job.job_id
    die_at_boot(world, job_id)
    second = world.store.get(job_id).current_attempt
    assert second is not None
    assert second.number == 2
    world.reactions.spot_warning(second.instance_ids[0])
    third = world.store.get(job_id).current_attempt
    assert third is not None
    assert third.number == 3
    assert world.store.get(job_id).attempt(2).ended_at is None  # the warned gang is still going down

    die_at_boot(world, job_id)

    job = world.store.get(job_id)
    assert job.state is not JobState.FAILED, job.status_detail
    assert job.current_attempt is not None
    assert job.current_attempt.number == 4
    assert [a.end_reason for a in job.attempts[:1] + job.attempts[2:3]] == ["died-at-boot", "died-at-boot"]
