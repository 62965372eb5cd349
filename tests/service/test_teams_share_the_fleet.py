"""Many teams share the fleet (issue 20): quotas, fair share, borrowing, and preemption that
checkpoints first, as the control plane plays them on the fakes."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from gpujobs.domain.job import Admission, Job, Ledgered
from gpujobs.domain.ledger import truth
from gpujobs.domain.reports import CheckpointReport, ExitReport
from gpujobs.domain.states import JobState, Reason
from gpujobs.domain.teams import parse_team_config
from gpujobs_fakes.memory import StaticTeamConfig
from tests.service.conftest import World, spec

PRINCIPAL = "AROAEXAMPLEID1234567"


def with_teams(world: World, teams: dict[str, dict[str, Any]], fleet: dict[str, Any] | None = None) -> World:
    document: dict[str, Any] = {"teams": {t: {"principals": [PRINCIPAL], **q} for t, q in teams.items()}}
    if fleet is not None:
        document["fleet"] = fleet
    return world.rewire(teams=StaticTeamConfig(parse_team_config(json.dumps(document))))


def submit(world: World, team: str, n: int, **overrides: Any) -> Job:
    message = f"m-{team}-{n}"
    outcome = world.service.handle_message(
        json.dumps(spec(name=f"{team}-{n}", team=team, gpus_per_node=4, **overrides)),
        message_id=message,
        sender=PRINCIPAL,
    )
    assert outcome.job.state is not JobState.REJECTED, outcome.job.problems
    return outcome.job


def finish(world: World, job: Job) -> None:
    """Its gang exits 0 and goes away."""
    current = world.store.get(job.job_id)
    attempt = current.current_attempt
    assert attempt is not None
    for iid in attempt.instance_ids:
        world.reactions.report(ExitReport(job_id=job.job_id, attempt=attempt.number, instance_id=iid, exit_code=0))
        world.compute.terminate([iid])
        world.reactions.instance_state(iid, "terminated")


def state(world: World, job: Job) -> JobState:
    return world.store.get(job.job_id).state


def ledger_is_exact(world: World) -> bool:
    jobs = [j for s in JobState for j in world.store.list_by_state(s, limit=10_000)]
    return world.store.ledger() == truth(jobs)


def test_a_job_over_its_teams_quota_waits_with_the_reason_and_starts_when_gpus_free_up(world: World) -> None:
    with_teams(world, {"vision": {"gpus": 8}})
    first, second = submit(world, "vision", 1), submit(world, "vision", 2)
    third = submit(world, "vision", 3)

    assert (state(world, first), state(world, second)) == (JobState.RUNNING, JobState.RUNNING)
    waiting = world.store.get(third.job_id)
    assert waiting.state is JobState.QUEUED
    assert waiting.admission is None
    assert "its team's quota is in use: vision holds 8 of its 8 GPU(s), it asks 4" in waiting.status_detail
    assert (JobState.QUEUED.value, JobState.QUEUED.value, Reason.ADMISSION_WAIT) in world.transitions(third.job_id)
    world.reconciler.run()
    assert state(world, third) is JobState.QUEUED  # still no room: the tick leaves it waiting

    finish(world, first)
    world.reconciler.run()

    started = world.store.get(third.job_id)
    assert started.state is JobState.RUNNING
    assert started.admission is not None
    assert (JobState.QUEUED.value, JobState.QUEUED.value, Reason.ADMITTED) in world.transitions(third.job_id)
    assert ledger_is_exact(world)


def test_freed_gpus_go_to_the_team_with_the_smaller_weighted_share(world: World) -> None:
    """The fleet's cap is the scarce room: vision took all 8 GPUs first; when 4 free up, speech
    (holding nothing) gets them, not vision's next job, though vision's was submitted earlier."""
    with_teams(world, {"vision": {"gpus": 16}, "speech": {"gpus": 16}}, {"max_gpus": 8})
    vision = [submit(world, "vision", n) for n in range(2)]
    vision_next = submit(world, "vision", 2)
    speech = submit(world, "speech", 1)
    assert [state(world, j) for j in (*vision, vision_next, speech)] == [
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.QUEUED,
        JobState.QUEUED,
    ]

    finish(world, vision[0])
    world.reconciler.run()

    assert state(world, speech) is JobState.RUNNING
    assert state(world, vision_next) is JobState.QUEUED
    assert ledger_is_exact(world)


def test_a_team_borrows_idle_quota_and_gives_it_back_after_a_checkpoint_when_the_lender_wants_it(
    world: World,
) -> None:
    """speech borrows vision's idle GPUs; vision submits: speech's borrowed job is asked to checkpoint,
    stops once the commit is in (within a spot warning's two minutes), waits again in its place, and
    vision's job starts on the next tick."""
    with_teams(world, {"vision": {"gpus": 8}, "speech": {"gpus": 4, "borrow": True}}, {"max_gpus": 12})
    own = submit(world, "speech", 1)
    borrower = submit(world, "speech", 2)
    assert state(world, borrower) is JobState.QUEUED  # it must borrow: the next tick lends
    world.reconciler.run()
    lent = world.store.get(borrower.job_id)
    assert lent.state is JobState.RUNNING
    assert lent.admission is not None
    assert lent.admission.borrowed == 4
    world.reactions.report(CheckpointReport(job_id=lent.job_id, attempt=1, step=100, uri="s3://c/j/step-100"))
    owner = [submit(world, "vision", 1), submit(world, "vision", 2)]
    assert state(world, owner[0]) is JobState.RUNNING
    assert state(world, owner[1]) is JobState.QUEUED  # the fleet is full: 4 + 4 borrowed + 4

    world.reconciler.run()  # vision wants its quota back: the borrowed job is preempted, checkpoint first

    asked = world.store.get(borrower.job_id)
    assert asked.stop_request is not None
    assert asked.stop_request.reason is Reason.PREEMPTED
    assert asked.stop_request.deadline - asked.stop_request.requested_at == timedelta(minutes=2)
    assert world.signaller.signals[-1][0] == lent.instance_ids
    assert all(world.compute.instances[i].state == "running" for i in lent.instance_ids)  # not before the commit

    world.clock.advance(seconds=30)
    world.reactions.report(CheckpointReport(job_id=lent.job_id, attempt=1, step=140, uri="s3://c/j/step-140"))
    for iid in lent.instance_ids:
        world.reactions.instance_state(iid, "terminated")
    requeued = world.store.get(borrower.job_id)
    assert requeued.state is JobState.QUEUED
    assert requeued.admission is None
    assert requeued.checkpoint_step == 140  # it resumes from the checkpoint it took for the preemption
    assert requeued.created_at == borrower.created_at  # its place: its submission time
    assert (JobState.RUNNING.value, JobState.QUEUED.value, Reason.PREEMPTED) in world.transitions(borrower.job_id)
    assert all(world.compute.instances[i].state != "running" for i in lent.instance_ids)

    world.reconciler.run()
    assert state(world, owner[1]) is JobState.RUNNING
    assert state(world, own) is JobState.RUNNING  # speech's own quota was never touched
    assert ledger_is_exact(world)


def test_a_preempted_job_that_never_commits_is_stopped_at_the_spot_warnings_bound(world: World) -> None:
    with_teams(world, {"vision": {"gpus": 4}, "speech": {"gpus": 0, "borrow": True}}, {"max_gpus": 4})
    borrower = submit(world, "speech", 1)
    world.reconciler.run()
    assert state(world, borrower) is JobState.RUNNING
    owner = submit(world, "vision", 1)
    world.reconciler.run()
    instances = world.store.get(borrower.job_id).instance_ids

    world.clock.advance(seconds=119)
    world.reconciler.run()
    assert all(world.compute.instances[i].state == "running" for i in instances)
    world.clock.advance(seconds=2)
    world.reconciler.run()

    assert all(world.compute.instances[i].state != "running" for i in instances)
    for iid in instances:
        world.reactions.instance_state(iid, "terminated")
    world.reconciler.run()
    assert state(world, borrower) is JobState.QUEUED
    assert state(world, owner) is JobState.RUNNING


def test_a_drained_fleet_admits_nothing_new_and_its_running_jobs_go_on(world: World) -> None:
    with_teams(world, {"vision": {"gpus": 8}}, {"drain": True})
    waiting = submit(world, "vision", 1)

    world.reconciler.run()

    assert state(world, waiting) is JobState.QUEUED
    assert "the fleet is drained" in world.store.get(waiting.job_id).status_detail
    with_teams(world, {"vision": {"gpus": 8}})
    world.reconciler.run()
    assert state(world, waiting) is JobState.RUNNING


def test_a_job_of_a_release_before_the_ledger_is_counted_by_the_reconciler_as_it_stands(world: World) -> None:
    with_teams(world, {"vision": {"gpus": 8}})
    running = submit(world, "vision", 1)
    stored = world.store.get(running.job_id)
    legacy = stored.model_copy(update={"counted": False, "admission": None, "ledgered": Ledgered()})
    world.store._jobs[running.job_id] = legacy  # as the previous release left it: not in the ledger
    world.store._ledger.clear()

    world.reconciler.run()

    enrolled = world.store.get(running.job_id)
    assert enrolled.counted
    assert enrolled.admission == Admission(at=enrolled.admission.at, detail="held since before GPU quotas were counted")  # type: ignore[union-attr]
    assert world.store.ledger().team("vision") == 4
    assert ledger_is_exact(world)


def test_a_family_the_team_has_filled_is_skipped_by_the_launch(world: World) -> None:
    with_teams(world, {"vision": {"gpus": 16, "gpus_by_family": {"p4d": 4}}})
    first = submit(world, "vision", 1, instance_types=["p4d.24xlarge", "g5.xlarge"])
    second = submit(world, "vision", 2, instance_types=["p4d.24xlarge", "g5.xlarge"])
    only_p4d = submit(world, "vision", 3, instance_types=["p4d.24xlarge"])

    assert world.store.get(first.job_id).current_attempt.instance_type == "p4d.24xlarge"  # type: ignore[union-attr]
    assert world.store.get(second.job_id).current_attempt.instance_type == "g5.xlarge"  # type: ignore[union-attr]
    waiting = world.store.get(only_p4d.job_id)
    assert waiting.state is JobState.QUEUED
    assert "holds all the GPUs its quota allows in p4d" in waiting.status_detail
    assert world.store.ledger().get("gpus/vision/p4d") == 4
    assert ledger_is_exact(world)


def test_a_job_an_older_release_ended_is_taken_off_the_ledger_by_the_reconciler(world: World) -> None:
    """During an upgrade (or a rollback) the previous release still writes jobs: it carries `ledgered`
    as it found it and adds nothing to the ledger. The reconciler sets such a record right."""
    with_teams(world, {"vision": {"gpus": 8}})
    job = submit(world, "vision", 1)
    stored = world.store.get(job.job_id)
    ended = stored.transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=world.clock.now())
    world.store._jobs[job.job_id] = ended.model_copy(update={"version": stored.version + 1})  # the old release's write
    assert world.store.ledger().team("vision") == 4
    assert not ledger_is_exact(world)

    world.reconciler.run()

    assert world.store.ledger().team("vision") == 0
    assert ledger_is_exact(world)
