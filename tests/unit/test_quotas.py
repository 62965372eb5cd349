"""Which EC2 vCPU quota refused a launch, and the status a waiting job shows for it (`domain.quotas`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpujobs.domain.job import MAX_DETAIL_CHARS, LaunchTry, Market
from gpujobs.domain.quotas import QuotaRefusal, family, quota_detail, quota_for, refused_by_quota

AT = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("instance_type", "market", "code"),
    [
        ("g5.xlarge", Market.ON_DEMAND, "L-DB2E81BA"),
        ("g4dn.12xlarge", Market.SPOT, "L-3819A6DF"),
        ("vt1.3xlarge", Market.ON_DEMAND, "L-DB2E81BA"),
        ("p4d.24xlarge", Market.ON_DEMAND, "L-417A185B"),
        ("p5.48xlarge", Market.SPOT, "L-7212CCBC"),
        ("c7i.large", Market.ON_DEMAND, "L-1216C47A"),
        ("m5.large", Market.SPOT, "L-34B43A08"),
    ],
)
def test_each_family_and_market_has_its_quota(instance_type: str, market: Market, code: str) -> None:
    quota = quota_for(instance_type, market)
    assert quota is not None
    assert quota.code == code


@pytest.mark.parametrize("instance_type", ["trn1.32xlarge", "inf2.xlarge", "dl1.24xlarge", "x2idn.16xlarge"])
def test_a_family_the_table_does_not_know_is_named_by_its_letters_not_guessed(instance_type: str) -> None:
    assert quota_for(instance_type, Market.ON_DEMAND) is None
    assert family(instance_type) not in {"G", "P", "Standard"}
    (refusal,) = refused_by_quota([_try(instance_type, Market.ON_DEMAND, "VcpuLimitExceeded")])
    assert instance_type in quota_detail([refusal])
    assert "--quota-code" not in quota_detail([refusal])


def test_one_quota_met_in_two_zones_is_named_once_and_capacity_refusals_are_not_quotas() -> None:
    tries = [
        _try("g5.xlarge", Market.SPOT, "MaxSpotInstanceCountExceeded"),
        _try("g6.xlarge", Market.SPOT, "MaxSpotInstanceCountExceeded"),
        _try("g5.xlarge", Market.ON_DEMAND, "InsufficientInstanceCapacity"),
    ]
    assert [r.label for r in refused_by_quota(tries)] == ["L-3819A6DF"]


def test_two_quotas_with_their_values_and_other_refusals_fit_the_records_detail() -> None:
    refusals = [
        QuotaRefusal(quota_for("p5.48xlarge", Market.SPOT), "p5.48xlarge", Market.SPOT, None),
        QuotaRefusal(quota_for("p5.48xlarge", Market.ON_DEMAND), "p5.48xlarge", Market.ON_DEMAND, 96.0),
    ]
    text = quota_detail(refusals)
    assert "All P Spot Instance Requests (L-7212CCBC) = value unknown" in text
    assert "Running On-Demand P instances (L-417A185B) = 96 vCPUs" in text
    assert "--quota-code L-7212CCBC --desired-value <vCPUs> (the same for each code)" in text
    assert len(text) <= MAX_DETAIL_CHARS


def _try(instance_type: str, market: Market, code: str) -> LaunchTry:
    return LaunchTry(
        at=AT, instance_type=instance_type, zone="us-east-1a", subnet_id="subnet-a", market=market, error_code=code
    )
