"""Spot pools chosen by evidence (`domain.pools`): a pure ranking of the ladder's rungs by the
stack's own reclaims, decaying, and a hard rule for pools reclaimed minutes ago."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpujobs.domain.job import Market
from gpujobs.domain.ladder import Rung, SubnetZone, plan_ladder
from gpujobs.domain.pools import HALF_LIFE, HORIZON, RECENT, Reclaim, rank, risk
from gpujobs.domain.spec import JobSpec, load_spec

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
ZONES = [SubnetZone(f"subnet-{z}", f"us-east-1{z}") for z in "abc"]
BOTH = [Market.SPOT, Market.ON_DEMAND]


def spec(*types: str) -> JobSpec:
    return load_spec(json.dumps({"name": "j", "image": "r/i:1", "command": ["x"], "instance_types": list(types)}))


def order(rungs: list[Rung]) -> list[tuple[str, str, str]]:
    return [(r.instance_type, r.zone[-1], r.market.value) for r in rungs]


def reclaim(zone: str, hours_ago: float, *, key: str = "", instance_type: str = "g5.xlarge") -> Reclaim:
    return Reclaim(instance_type, f"us-east-1{zone}", NOW - timedelta(hours=hours_ago), key)


def test_without_evidence_the_ladder_keeps_its_order() -> None:
    ladder = plan_ladder(spec("g5.xlarge"), ZONES, markets=BOTH, reclaims=[], now=NOW)
    assert order(ladder) == [("g5.xlarge", z, m) for m in ("spot", "on-demand") for z in "abc"]


def test_a_types_zones_go_from_the_least_reclaimed_and_on_demand_is_not_reordered() -> None:
    evidence = [reclaim("a", 2, key="j-1#1"), reclaim("a", 3, key="j-2#1"), reclaim("b", 2, key="j-3#1")]
    ladder = plan_ladder(spec("g5.xlarge"), ZONES, markets=BOTH, reclaims=evidence, now=NOW)
    assert order(ladder) == [
        ("g5.xlarge", "c", "spot"),
        ("g5.xlarge", "b", "spot"),
        ("g5.xlarge", "a", "spot"),
        ("g5.xlarge", "a", "on-demand"),
        ("g5.xlarge", "b", "on-demand"),
        ("g5.xlarge", "c", "on-demand"),
    ]


def test_the_users_type_order_is_kept_and_evidence_only_orders_zones_within_a_type() -> None:
    evidence = [reclaim("a", 2, key="j-1#1"), reclaim("b", 2, key="j-2#1"), reclaim("c", 2, key="j-3#1")]
    ladder = plan_ladder(spec("g5.xlarge", "g6.xlarge"), ZONES, markets=[Market.SPOT], reclaims=evidence, now=NOW)
    assert [r.instance_type for r in ladder] == ["g5.xlarge"] * 3 + ["g6.xlarge"] * 3
    assert order(ladder)[3:] == [("g6.xlarge", z, "spot") for z in "abc"]


def test_a_pool_reclaimed_minutes_ago_goes_after_every_other_rung_even_on_demand() -> None:
    """Drops come together: a replacement launched into the pool just reclaimed boots for nine
    minutes only to be reclaimed again, so even on-demand comes first."""
    just_now = reclaim("b", 5 / 60, key="j-9#4")
    ladder = plan_ladder(spec("g5.xlarge", "g6.xlarge"), ZONES, markets=BOTH, reclaims=[just_now], now=NOW)
    assert order(ladder)[-1] == ("g5.xlarge", "b", "spot")
    assert order(ladder)[0] == ("g5.xlarge", "a", "spot")
    assert ("g6.xlarge", "b", "spot") in order(ladder)[:5]  # another type's pool in that zone is not tainted
    past = plan_ladder(spec("g5.xlarge"), ZONES, markets=BOTH, reclaims=[just_now], now=NOW + RECENT)
    assert order(past)[:3] == [("g5.xlarge", z, "spot") for z in "acb"]  # past RECENT: only its weight


def test_a_reclaim_weighs_half_as_much_every_half_life_and_nothing_past_the_horizon() -> None:
    weights = risk([reclaim("a", 0), reclaim("b", HALF_LIFE / timedelta(hours=1))], now=NOW)
    assert weights[("g5.xlarge", "us-east-1a")] == pytest.approx(1.0)
    assert weights[("g5.xlarge", "us-east-1b")] == pytest.approx(0.5)
    assert risk([reclaim("a", HORIZON / timedelta(hours=1) + 1)], now=NOW) == {}
    # two old reclaims outweigh one fresh one only while they are fresh enough: 2 * 0.5**2 < 1
    older = [reclaim("a", 12, key="j-1#1"), reclaim("a", 12, key="j-2#1"), reclaim("b", 0.9, key="j-3#1")]
    assert order(rank(plan_ladder(spec("g5.xlarge"), ZONES, markets=[Market.SPOT]), older, now=NOW))[:2] == [
        ("g5.xlarge", "c", "spot"),
        ("g5.xlarge", "a", "spot"),
    ]


def test_a_reclaim_recorded_twice_counts_once() -> None:
    twice = [reclaim("a", 1, key="j-1#2"), reclaim("a", 1, key="j-1#2")]
    assert risk(twice, now=NOW) == risk(twice[:1], now=NOW)


# ---- EC2's spot placement scores: after the stack's own reclaims, before the subnets' order ----


def test_zones_the_stack_has_no_reclaims_in_go_by_their_placement_score_highest_first() -> None:
    scores = {"us-east-1a": 3, "us-east-1b": 9, "us-east-1c": 6}
    ladder = plan_ladder(spec("g5.xlarge"), ZONES, markets=BOTH, now=NOW, zone_scores=scores)
    assert order(ladder) == [
        ("g5.xlarge", "b", "spot"),
        ("g5.xlarge", "c", "spot"),
        ("g5.xlarge", "a", "spot"),
        # on-demand is not spot's to score: its zones keep the subnets' order
        *[("g5.xlarge", z, "on-demand") for z in "abc"],
    ]


def test_a_zone_not_scored_goes_after_those_scored_and_no_scores_keep_the_subnets_order() -> None:
    ladder = plan_ladder(spec("g5.xlarge"), ZONES, markets=[Market.SPOT], now=NOW, zone_scores={"us-east-1c": 1})
    assert [z for _, z, _ in order(ladder)] == ["c", "a", "b"]
    assert order(plan_ladder(spec("g5.xlarge"), ZONES, markets=[Market.SPOT], now=NOW, zone_scores={})) == order(
        plan_ladder(spec("g5.xlarge"), ZONES, markets=[Market.SPOT])
    )


def test_the_stacks_own_reclaims_come_before_a_high_score_but_a_day_old_one_does_not() -> None:
    scores = {"us-east-1a": 10, "us-east-1b": 2, "us-east-1c": 5}
    two_this_morning = [reclaim("a", 2, key="j-1#1"), reclaim("a", 4, key="j-2#1")]
    ladder = plan_ladder(
        spec("g5.xlarge"), ZONES, markets=[Market.SPOT], reclaims=two_this_morning, now=NOW, zone_scores=scores
    )
    assert [z for _, z, _ in order(ladder)] == ["c", "b", "a"]
    # one reclaim a day ago weighs 1/16 of a fresh one: to the nearest whole reclaim, none, so the score decides
    a_day_ago = [reclaim("a", 24, key="j-3#1")]
    ladder = plan_ladder(
        spec("g5.xlarge"), ZONES, markets=[Market.SPOT], reclaims=a_day_ago, now=NOW, zone_scores=scores
    )
    assert [z for _, z, _ in order(ladder)] == ["a", "c", "b"]


def test_a_pool_reclaimed_minutes_ago_goes_last_however_high_its_score() -> None:
    ladder = plan_ladder(
        spec("g5.xlarge"),
        ZONES,
        markets=BOTH,
        reclaims=[reclaim("b", 0.1, key="j-1#1")],
        now=NOW,
        zone_scores={"us-east-1a": 1, "us-east-1b": 10, "us-east-1c": 1},
    )
    assert order(ladder)[-1] == ("g5.xlarge", "b", "spot")
    assert order(ladder)[:2] == [("g5.xlarge", "a", "spot"), ("g5.xlarge", "c", "spot")]


def test_scores_never_reorder_the_spec_types_or_the_markets() -> None:
    ladder = plan_ladder(
        spec("g5.xlarge", "g6.xlarge"), ZONES, markets=BOTH, now=NOW, zone_scores={"us-east-1c": 10, "us-east-1a": 4}
    )
    assert [(t, m) for t, _, m in order(ladder)] == [
        (t, m) for m in ("spot", "on-demand") for t in ("g5.xlarge", "g6.xlarge") for _ in "abc"
    ]
    assert [z for t, z, m in order(ladder) if m == "spot" and t == "g6.xlarge"] == ["c", "a", "b"]
