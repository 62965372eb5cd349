"""A multi-node gang whose all-reduce, measured by the launcher before any of the job's code ran, is
below its type's floor exits 123 (`ExitCode.SLOW_INTERCONNECT`): the gang is relaunched on other
hosts without spending an attempt or counting an interruption, and the record names the instances
and the figure. It is the job's container's claim, not the host's, so it never scores a spot pool
down, and it is believed only while the gang has made no progress: a 123 after training began is
the workload's own exit, a crash."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from gpujobs.adapters.catalog import packaged_hardware
from gpujobs.contract import ExitCode
from gpujobs.domain.decisions import on_exit
from gpujobs.domain.effects import Terminate
from gpujobs.domain.fate import UNHEALTHY_LIMIT
from gpujobs.domain.job import Admission, Job, Market
from gpujobs.domain.launching import Gang, claim_launch, record_launch
from gpujobs.domain.pools import reclaims_of
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import CONFIG, World, spec
from tests.service.test_an_unhealthy_node_is_replaced_without_spending_an_attempt import gang_goes, node_reports

MEASURED = (
    "all-reduce bus bandwidth 3.10 GB/s across 2 nodes (16 ranks) is below p4d.24xlarge's floor of 12.50 GB/s"
    " (a quarter of its network): relaunched on other hosts"
)
SAID = f"workload exited with 123: {MEASURED}"
"""What the bootstrap reports for the node: the container's code and its last stderr line."""
GANG = {"nodes": 2, "instance_types": ["p4d.24xlarge"]}


def gang_reports(world: World, job: Job, code: int, *, message: str = SAID) -> tuple[str, ...]:
    """Every node of the current gang exits `code`: the check's figure is the same on every node."""
    for node in range(job.require_spec().nodes):
        node_reports(world, job, code, node=node, message=message)
    attempt = job.current_attempt
    assert attempt is not None
    return attempt.instance_ids


def test_a_gang_below_its_floor_is_relaunched_on_other_hosts_uncounted_and_its_pool_not_scored(
    world: World,
) -> None:
    job = world.submit(spec(**GANG, capacity="spot", max_attempts=1)).job
    gang = gang_reports(world, job, ExitCode.SLOW_INTERCONNECT)
    gang_goes(world, job.job_id, 1)
    after = world.store.get(job.job_id)

    assert after.state is JobState.RUNNING  # max_attempts 1 is not spent, and 123 is no configuration error
    assert after.current_attempt is not None
    assert after.current_attempt.number == 2
    assert set(after.current_attempt.instance_ids).isdisjoint(gang)
    assert (after.crashes, after.interruptions) == (0, 0)
    first = after.attempts[0]
    assert first.end_reason == "slow-interconnect"
    assert first.slow_interconnect == dict.fromkeys(gang, SAID)
    [ended] = [e for e in after.history if e.reason is Reason.SLOW_INTERCONNECT]
    assert (
        ended.detail
        == f"slow interconnect, relaunched on other hosts without spending an attempt: {', '.join(gang)}: {SAID}"
    )
    assert reclaims_of(after) == []  # the job's own claim never steers other jobs off the pool


@pytest.mark.parametrize("progress", ["heartbeat", "checkpoint"])
def test_a_123_after_the_gang_trained_is_the_workloads_crash(world: World, progress: str) -> None:
    job = world.submit(spec(**GANG, max_attempts=2, checkpoint="directory")).job
    if progress == "heartbeat":
        world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=40))
    else:  # a directory job's sync of its folder
        world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=40, uri="s3://b/ckpt/40"))
    gang_reports(world, world.store.get(job.job_id), ExitCode.SLOW_INTERCONNECT, message="workload exited with 123")
    gang_goes(world, job.job_id, 1)
    after = world.store.get(job.job_id)

    assert after.attempts[0].end_reason == "crashed"
    assert after.crashes == 1
    assert Reason.CRASHED_RETRYING in [e.reason for e in after.history]
    assert Reason.SLOW_INTERCONNECT not in [e.reason for e in after.history]


def test_a_replacement_that_has_not_trained_yet_is_believed_though_its_predecessor_trained(world: World) -> None:
    job = world.submit(spec(**GANG, max_attempts=2)).job
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=40))
    node_reports(world, world.store.get(job.job_id), ExitCode.CRASHED, message="workload exited with 1")
    gang_goes(world, job.job_id, 1)

    gang_reports(world, world.store.get(job.job_id), ExitCode.SLOW_INTERCONNECT)
    gang_goes(world, job.job_id, 2)
    after = world.store.get(job.job_id)

    assert [a.end_reason for a in after.attempts] == ["crashed", "slow-interconnect", None]
    assert after.state is JobState.RUNNING  # its last attempt (max_attempts 2) is still to come
    assert after.crashes == 1


def test_the_launchers_and_the_bootstraps_reports_of_one_123_end_the_attempt_once(world: World) -> None:
    job = world.submit(spec(**GANG)).job
    for rank in (0, 1):  # the launcher in the container reports first, by node rank, in its own words
        world.reactions.report(
            ExitReport(job_id=job.job_id, attempt=1, node_rank=rank, exit_code=123, message=MEASURED)
        )
    gang = gang_reports(world, job, ExitCode.SLOW_INTERCONNECT)  # then each node's bootstrap
    gang_goes(world, job.job_id, 1)
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=gang[0], exit_code=123))
    world.reconciler.run()
    after = world.store.get(job.job_id)

    assert [e.reason for e in after.history].count(Reason.SLOW_INTERCONNECT) == 1
    assert [a.end_reason for a in after.attempts] == ["slow-interconnect", None]
    assert (after.crashes, after.interruptions) == (0, 0)
    assert after.attempts[0].slow_interconnect == dict.fromkeys(gang, MEASURED)  # the first word stands


def test_slow_interconnects_and_failed_gpu_checks_in_a_row_fail_the_job_saying_so(world: World) -> None:
    job = world.submit(spec(**GANG, max_attempts=10)).job
    node_reports(world, job, ExitCode.UNHEALTHY_NODE, message="GPU check failed")
    gang_goes(world, job.job_id, 1)
    for number in range(2, UNHEALTHY_LIMIT + 1):
        gang_reports(world, world.store.get(job.job_id), ExitCode.SLOW_INTERCONNECT)
        gang_goes(world, job.job_id, number)
    failed = world.store.get(job.job_id)

    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.SLOW_INTERCONNECT
    assert len(failed.attempts) == UNHEALTHY_LIMIT
    assert (failed.crashes, failed.interruptions) == (0, 0)
    assert world.compute.live() == []


def test_a_hosts_failed_gpu_check_wins_over_its_peers_123_and_scores_its_pool(world: World) -> None:
    job = world.submit(spec(**GANG, capacity="spot")).job
    bad = node_reports(world, job, ExitCode.UNHEALTHY_NODE, message="GPU check failed", node=0)
    node_reports(world, job, ExitCode.SLOW_INTERCONNECT, node=1)
    gang_goes(world, job.job_id, 1)
    after = world.store.get(job.job_id)

    assert after.attempts[0].end_reason == "unhealthy-node"
    assert after.attempts[0].unhealthy == {bad: "GPU check failed"}
    assert len(reclaims_of(after)) == 1


def test_a_gang_below_its_floor_is_never_kept_for_inspection(world: World) -> None:
    """With `keep_on_failure` each bootstrap keeps its host up after the 123 (a crash, to it): the
    control plane terminates the gang and relaunches, even on the job's last attempt."""
    job = world.submit(spec(**GANG, keep_on_failure="1h", max_attempts=1, capacity="on-demand")).job
    gang = gang_reports(world, job, ExitCode.SLOW_INTERCONNECT)
    after = world.store.get(job.job_id)

    assert not set(gang) & {f.instance.instance_id for f in world.compute.live()}
    assert after.kept is None
    assert after.attempts[0].end_reason == "slow-interconnect"
    assert after.state in (JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING)


def test_a_gang_below_its_floor_whose_reports_overtook_its_launch_is_terminated_not_kept() -> None:
    """Both nodes' 123 arrive before RunInstances' answer is recorded: the attempt is judged as the
    launch is recorded, with no node left to wait for, and the hosts their bootstraps kept up go."""
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    job = Job.submitted(
        job_id="j-0000000000000001",
        spec=validate_spec(
            {"name": "d", "image": "img:1", "command": ["t"], **GANG, "keep_on_failure": "1h", "max_attempts": 1}
        ),
        now=now,
        message_id="m-1",
    )
    heard = claim_launch(job, now=now, hold=None, admission=Admission(at=now)).job
    for rank in (0, 1):
        assert heard is not None
        early = ExitReport(job_id=job.job_id, attempt=1, exit_code=123, node_rank=rank, message=SAID)
        heard = on_exit(heard, early, now=now).job
    assert heard is not None

    gang = Gang(("i-0aaaabbbbccccdddd", "i-0aaaabbbbcccceeee"), "p4d.24xlarge", "us-east-1a", Market.SPOT, "subnet-a")
    launched = record_launch(heard, attempt_number=1, gang=gang, tries=(), now=now)

    assert launched.job is not None
    assert launched.job.state is JobState.QUEUED
    assert launched.job.kept is None
    assert launched.job.attempts[0].slow_interconnect == dict.fromkeys(gang.instance_ids, SAID)
    assert Terminate(gang.instance_ids) in launched.effects


def test_after_two_slow_gangs_in_a_row_the_third_is_told_to_measure_only_and_is_not_sent_away(world: World) -> None:
    """A floor the type's hosts keep missing is the image's NCCL setup or the floor, not the hosts: the
    third gang's run document names no floor, so it trains at what it gets instead of failing the job."""
    world.rewire(config=replace(CONFIG, hardware=packaged_hardware()))
    job = world.submit(spec(**GANG, max_attempts=1)).job
    for number in (1, 2):
        assert told_floors(world, number) == {"p4d.24xlarge": 12.5}
        gang_reports(world, world.store.get(job.job_id), ExitCode.SLOW_INTERCONNECT)
        gang_goes(world, job.job_id, number)

    assert told_floors(world, 3) == {}
    assert world.store.get(job.job_id).state is JobState.RUNNING


def told_floors(world: World, attempt: int) -> dict[str, float]:
    """The floors the run document of `attempt`'s launch named (one launch per attempt here)."""
    [request] = [r for r in world.compute.calls if r.attempt == attempt]
    floors: dict[str, float] = json.loads(request.user_data)["interconnect_floors"]
    return floors
