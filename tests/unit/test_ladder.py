"""The capacity ladder and backoff are pure decisions: which pools to try, in which order, when next."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from gpujobs.domain.job import Market
from gpujobs.domain.ladder import (
    ErrorKind,
    SubnetZone,
    classify_launch_error,
    markets_for,
    next_try_delay,
    plan_ladder,
)
from gpujobs.domain.spec import load_spec

SUBNETS = [SubnetZone("subnet-a", "us-east-1a"), SubnetZone("subnet-b", "us-east-1b")]


def make(**extra: object) -> object:
    body = {"name": "j", "image": "r/i:1", "command": ["x"], "instance_types": ["g5.xlarge", "g6.xlarge"], **extra}
    return load_spec(__import__("json").dumps(body))


def pools(rungs: list) -> list[tuple[str, str, str]]:  # type: ignore[type-arg]
    return [(r.instance_type, r.zone, r.market.value) for r in rungs]


def test_spot_first_tries_every_spot_pool_in_type_order_before_any_on_demand() -> None:
    ladder = pools(plan_ladder(make(), SUBNETS, markets=markets_for(make(), interruptions=0)))
    assert ladder == [
        ("g5.xlarge", "us-east-1a", "spot"),
        ("g5.xlarge", "us-east-1b", "spot"),
        ("g6.xlarge", "us-east-1a", "spot"),
        ("g6.xlarge", "us-east-1b", "spot"),
        ("g5.xlarge", "us-east-1a", "on-demand"),
        ("g5.xlarge", "us-east-1b", "on-demand"),
        ("g6.xlarge", "us-east-1a", "on-demand"),
        ("g6.xlarge", "us-east-1b", "on-demand"),
    ]


def test_spot_first_is_never_given_up_for_its_interruptions_and_goes_on_demand_first_while_volatile() -> None:
    """Issue 21: `max_interruptions` is a limit of `spot` jobs only; a volatile spot-first job
    launches on on-demand first and still on spot when on-demand has no room."""
    assert markets_for(make(max_interruptions=2), interruptions=50) == [Market.SPOT, Market.ON_DEMAND]
    assert markets_for(make(), interruptions=3, volatile=True) == [Market.ON_DEMAND, Market.SPOT]
    assert markets_for(make(), interruptions=3, volatile=True, spot_only=True) == [Market.SPOT]


def test_a_spot_only_job_past_its_interruption_limit_has_no_market_left() -> None:
    assert markets_for(make(capacity="spot", max_interruptions=1), interruptions=2) == []
    assert markets_for(make(capacity="spot", max_interruptions=1), interruptions=1) == [Market.SPOT]


def test_a_forecasted_budget_breach_removes_on_demand_rungs() -> None:
    assert markets_for(make(), interruptions=0, spot_only=True) == [Market.SPOT]


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("InsufficientInstanceCapacity", ErrorKind.NEXT_RUNG),
        ("SpotMaxPriceTooLow", ErrorKind.NEXT_RUNG),
        ("MaxSpotInstanceCountExceeded", ErrorKind.QUOTA),
        ("VcpuLimitExceeded", ErrorKind.QUOTA),
        ("InstanceLimitExceeded", ErrorKind.NEXT_RUNG),
        ("Unsupported", ErrorKind.NEXT_RUNG),
        ("RequestLimitExceeded", ErrorKind.TRANSIENT),
        ("InvalidAMIID.Malformed", ErrorKind.FATAL),
        ("UnauthorizedOperation", ErrorKind.FATAL),
    ],
)
def test_launch_errors_are_classified(code: str, kind: ErrorKind) -> None:
    assert classify_launch_error(code) is kind


def test_backoff_grows_exponentially_is_capped_and_jittered() -> None:
    low = [next_try_delay(n, jitter=0.0) for n in range(1, 10)]
    high = [next_try_delay(n, jitter=0.999) for n in range(1, 10)]
    assert all(a <= b for a, b in itertools.pairwise(high))
    assert high[-1] <= timedelta(minutes=30)
    assert high[3] > high[0]
    assert all(lo <= hi for lo, hi in zip(low, high, strict=True))
    assert low[0] == timedelta(seconds=30)


def test_a_job_waiting_for_capacity_walks_the_ladder_again_within_five_minutes() -> None:
    # SkyPilot's cap: room that comes back is used within minutes, not half an hour later.
    assert max(next_try_delay(n, jitter=0.999) for n in range(1, 40)) <= timedelta(minutes=5)
    assert next_try_delay(20, jitter=0.999) > timedelta(minutes=4, seconds=59)
