"""RunInstances idempotency as EC2 keeps it: one ClientToken per attempt and pool, and a token sent
again with other parameters (`IdempotentParameterMismatch`) means "adopt or move on".

The fake compute refuses a reused token with other parameters exactly as EC2 does. A takeover's
run document differs from the crashed launcher's when a checkpoint was committed in between (it
resumes from a newer step), which is how a real takeover meets the mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpujobs.domain.job import Attempt, Market
from gpujobs.domain.ladder import SubnetZone, plan_ladder
from gpujobs.domain.launching import LAUNCH_LEASE
from gpujobs.domain.pools import Reclaim
from gpujobs.domain.reports import CheckpointReport
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState
from gpujobs.service.ports import LaunchedInstance
from tests.service.conftest import ALLOWED, World, spec


class CrashAfterLaunchError(Exception):
    """The launcher's Lambda dies once RunInstances has returned."""


def crash_after_run_instances(world: World, body: dict[str, Any], *, message_id: str) -> str:
    original = world.store.save

    def crashing_save(job: Any) -> Any:
        if job.state is JobState.RUNNING or (job.current_attempt and job.current_attempt.instance_ids):
            raise CrashAfterLaunchError
        return original(job)

    world.store.save = crashing_save  # type: ignore[method-assign]
    with pytest.raises(CrashAfterLaunchError):
        world.submit(body, message_id=message_id)
    world.store.save = original  # type: ignore[method-assign]
    return world.compute.calls[-1].job_id


def test_each_pool_gets_its_own_token_whatever_its_place_in_the_ladder_and_tokens_fit_ec2s_64_ascii() -> None:
    job_spec = validate_spec(spec(instance_types=["p4d.24xlarge", "g5.xlarge"]), allowed_instance_types=ALLOWED)
    subnets = [SubnetZone("subnet-a", "us-east-1a"), SubnetZone("subnet-b", "us-east-1b")]
    attempt = Attempt(number=12345, started_at=datetime(2026, 11, 29, tzinfo=UTC))
    job_id = "j-0123456789abcdef"

    def tokens(
        markets: Sequence[Market] = (Market.SPOT, Market.ON_DEMAND), **ladder_options: Any
    ) -> dict[tuple[str, str, Market], str]:
        return {
            r.pool: attempt.client_token(job_id, instance_type=r.instance_type, subnet_id=r.subnet_id, market=r.market)
            for r in plan_ladder(job_spec, subnets, markets=markets, **ladder_options)
        }

    usual = tokens()
    just_now = Reclaim("p4d.24xlarge", "us-east-1a", attempt.started_at, "j-0#1")  # a reclaimed pool goes last
    reordered = tokens(reclaims=[just_now], now=attempt.started_at)
    spot_only = tokens(markets=[Market.SPOT])

    assert len(set(usual.values())) == len(usual) == 8
    assert reordered == usual
    assert list(reordered)[-1] == ("p4d.24xlarge", "us-east-1a", Market.SPOT)
    assert spot_only == {pool: token for pool, token in usual.items() if pool[2] is Market.SPOT}
    assert all(len(t) <= 64 and t.isascii() for t in usual.values())


def test_a_takeover_whose_token_ec2_remembers_with_other_parameters_adopts_the_gang_it_launched(world: World) -> None:
    job_id = crash_after_run_instances(world, spec(nodes=2), message_id="m-1")
    gang = {f.instance.instance_id for f in world.compute.live()}
    world.reactions.report(CheckpointReport(job_id=job_id, attempt=1, step=100, uri="s3://ckpt-bucket/step-100"))
    # DescribeInstances is eventually consistent: the takeover's first look misses the new gang.
    looks: list[int] = []
    find = world.compute.find_instances

    def lagging_find(*, job_id: str, attempt: int | None = None) -> list[LaunchedInstance]:
        looks.append(1)
        return [] if len(looks) == 1 else find(job_id=job_id, attempt=attempt)

    world.compute.find_instances = lagging_find  # type: ignore[method-assign]
    world.clock.current += LAUNCH_LEASE + timedelta(minutes=1)
    job = world.submit(spec(nodes=2), message_id="m-1").job

    assert job.state is JobState.RUNNING
    assert set(job.instance_ids) == gang
    assert len(world.compute.live()) == 2


def test_a_token_mismatch_with_the_gang_gone_moves_on_to_the_next_rung_instead_of_failing(world: World) -> None:
    job_id = crash_after_run_instances(world, spec(), message_id="m-1")
    first = world.compute.calls[-1]
    world.reactions.report(CheckpointReport(job_id=job_id, attempt=1, step=100, uri="s3://ckpt-bucket/step-100"))
    world.compute.terminate([f.instance.instance_id for f in world.compute.live()])  # reclaimed at once

    world.clock.current += LAUNCH_LEASE + timedelta(minutes=1)
    job = world.submit(spec(), message_id="m-1").job

    assert job.state is JobState.RUNNING
    attempt = job.current_attempt
    assert attempt is not None
    assert (attempt.instance_type, attempt.zone) != (first.instance_type, first.subnet.zone)
    assert [t.error_code for t in attempt.tries] == ["IdempotentParameterMismatch"]
    assert [f.instance.instance_id for f in world.compute.live()] == list(attempt.instance_ids)
