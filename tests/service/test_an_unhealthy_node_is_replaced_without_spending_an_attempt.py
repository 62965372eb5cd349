"""A node whose GPU check fails before training (exit 122), or whose workload fails while the kernel
logs a hardware XID (exit 121), is the host's fault, not the job's: the gang is terminated and
relaunched on another host without spending an attempt (max_attempts) or counting an interruption;
the record names the instance and what it found, and the pool is scored down."""

from __future__ import annotations

from datetime import UTC, datetime

from gpujobs.contract import ExitCode
from gpujobs.domain.decisions import on_exit
from gpujobs.domain.fate import REPORT_GRACE, UNHEALTHY_LIMIT
from gpujobs.domain.job import Admission, Job, Market
from gpujobs.domain.launching import Gang, claim_launch, record_launch
from gpujobs.domain.pools import reclaims_of
from gpujobs.domain.reports import ExitReport
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, spec

FOUND = "GPU check failed on p4d.24xlarge: nvidia-smi sees 7 GPU(s), the type has 8"


def node_reports(world: World, job: Job, code: int, *, node: int = 0, message: str = FOUND) -> str:
    attempt = job.current_attempt
    assert attempt is not None
    iid = attempt.instance_ids[node]
    world.reactions.report(
        ExitReport(job_id=job.job_id, attempt=attempt.number, instance_id=iid, exit_code=code, message=message)
    )
    return iid


def gang_goes(world: World, job_id: str, number: int) -> None:
    """The terminated gang's instances are seen gone; after the grace for reports still in flight
    (a node terminated while it waited for its peers reports nothing) the reconciler relaunches."""
    attempt = world.store.get(job_id).attempt(number)
    assert attempt is not None
    world.compute.terminate(list(attempt.instance_ids))
    for iid in attempt.instance_ids:
        world.reactions.instance_state(iid, "terminated")
    world.clock.advance(seconds=REPORT_GRACE.total_seconds() + 1)
    world.reconciler.run()


def test_an_unhealthy_node_of_a_gang_ends_it_and_the_gang_is_relaunched_uncounted(world: World) -> None:
    job = world.submit(spec(nodes=2, instance_types=["p4d.24xlarge"], max_attempts=1)).job
    bad = node_reports(world, job, ExitCode.UNHEALTHY_NODE)
    gang = world.store.get(job.job_id).attempts[0].instance_ids
    assert [i for i in gang if i in world.compute.live()] == []  # the control plane terminated the rest

    gang_goes(world, job.job_id, 1)
    after = world.store.get(job.job_id)

    assert after.state is JobState.RUNNING
    assert after.current_attempt is not None
    assert after.current_attempt.number == 2
    assert (after.crashes, after.interruptions) == (0, 0)  # max_attempts 1 is not spent
    first = after.attempts[0]
    assert first.end_reason == "unhealthy-node"
    assert first.unhealthy == {bad: FOUND}
    assert any(e.reason is Reason.UNHEALTHY_NODE and FOUND in e.detail for e in after.history)
    assert set(after.current_attempt.instance_ids).isdisjoint(gang)


def test_a_single_unhealthy_node_is_relaunched_and_its_spot_pool_scored_down(world: World) -> None:
    job = world.submit(spec(capacity="spot", max_attempts=1)).job
    first = world.store.get(job.job_id).attempts[0]
    node_reports(world, job, ExitCode.UNHEALTHY_NODE)
    gang_goes(world, job.job_id, 1)
    after = world.store.get(job.job_id)

    assert after.state is JobState.RUNNING
    assert len(after.attempts) == 2
    assert (after.crashes, after.interruptions) == (0, 0)
    [scored] = reclaims_of(after)
    assert (scored.instance_type, scored.zone) == (first.instance_type, first.zone)


def test_an_unhealthy_report_twice_or_late_ends_the_attempt_once(world: World) -> None:
    job = world.submit(spec()).job
    node_reports(world, job, ExitCode.UNHEALTHY_NODE)
    gang_goes(world, job.job_id, 1)
    once = world.store.get(job.job_id)

    old = once.attempts[0]
    world.reactions.report(
        ExitReport(job_id=job.job_id, attempt=1, instance_id=old.instance_ids[0], exit_code=ExitCode.UNHEALTHY_NODE)
    )
    world.reactions.settle(job.job_id)
    world.reconciler.run()
    again = world.store.get(job.job_id)

    assert [e.reason for e in again.history].count(Reason.UNHEALTHY_NODE) == 1
    assert len(again.attempts) == 2
    assert len(world.compute.live()) == 1
    assert (again.crashes, again.interruptions) == (0, 0)


def test_xids_during_training_end_the_attempt_as_a_hardware_fault_not_a_crash(world: World) -> None:
    job = world.submit(spec(max_attempts=1)).job
    node_reports(world, job, ExitCode.HARDWARE_FAULT, message="workload exited with 1: hardware fault: XID 79")
    gang_goes(world, job.job_id, 1)
    after = world.store.get(job.job_id)

    assert after.state is JobState.RUNNING
    assert after.crashes == 0
    assert after.attempts[0].end_reason == "hardware-fault"
    assert any(e.reason is Reason.HARDWARE_FAULT for e in after.history)


def test_unhealthy_nodes_in_attempts_in_a_row_fail_the_job_saying_so(world: World) -> None:
    job = world.submit(spec(max_attempts=10)).job
    for number in range(1, UNHEALTHY_LIMIT + 1):
        node_reports(world, world.store.get(job.job_id), ExitCode.UNHEALTHY_NODE)
        gang_goes(world, job.job_id, number)
    failed = world.store.get(job.job_id)

    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.UNHEALTHY_NODE
    assert len(failed.attempts) == UNHEALTHY_LIMIT
    assert world.compute.live() == []
    assert failed.crashes == 0


def test_an_unhealthy_report_that_overtakes_the_launchs_record_names_the_node_once_it_is_recorded() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    job = Job.submitted(
        job_id="j-0000000000000001",
        spec=validate_spec({"name": "d", "image": "img:1", "command": ["t"], "instance_types": ["g5.xlarge"]}),
        now=now,
        message_id="m-1",
    )
    claimed = claim_launch(job, now=now, hold=None, admission=Admission(at=now)).job
    assert claimed is not None
    early = ExitReport(job_id=job.job_id, attempt=1, exit_code=ExitCode.UNHEALTHY_NODE, node_rank=0, message=FOUND)
    heard = on_exit(claimed, early, now=now).job  # the bootstrap's report came before RunInstances' answer
    assert heard is not None

    gang = Gang(("i-0aaaabbbbccccdddd",), "g5.xlarge", "us-east-1a", Market.SPOT, "subnet-a")
    launched = record_launch(heard, attempt_number=1, gang=gang, tries=(), now=now).job

    assert launched is not None
    assert launched.attempts[0].unhealthy == {"i-0aaaabbbbccccdddd": FOUND}
    assert launched.state is JobState.QUEUED
    assert launched.history[-1].reason is Reason.UNHEALTHY_NODE
