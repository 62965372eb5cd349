"""Where an instance type is offered, as the launcher and `validate` decide it (`domain.offerings`).

Stories: a zone that EC2 says offers a type is tried, one that it says does not is skipped, and a
type nobody described is tried everywhere (EC2 has the last word); the bundled snapshot seen from a
region gives that region's zones, an empty set where it offers the type elsewhere only, and nothing
at all for a region it does not cover; a refusal names the regions that do offer the type, the
same geography first.
"""

from __future__ import annotations

from gpujobs.domain.offerings import in_region, not_offered_in_region, offered, offered_zones

SNAPSHOT = {
    "p5e.48xlarge": {"us-east-2": frozenset({"us-east-2a", "us-east-2b"}), "eu-north-1": frozenset({"eu-north-1a"})},
    "g5.xlarge": {"us-east-1": frozenset({"us-east-1a", "us-east-1b"}), "us-east-2": frozenset({"us-east-2a"})},
}


def test_a_zone_offers_a_type_only_when_the_offerings_say_so() -> None:
    zones = {"p5e.48xlarge": frozenset({"us-east-2a"}), "g6.xlarge": frozenset()}

    assert offered(zones, "p5e.48xlarge", "us-east-2a")
    assert not offered(zones, "p5e.48xlarge", "us-east-2c")
    assert not offered(zones, "g6.xlarge", "us-east-2a")  # described: offered in no zone here
    assert offered(zones, "p7.48xlarge", "us-east-2a")  # undescribed: left to EC2


def test_the_zones_to_try_keep_their_order() -> None:
    zones = {"g5.xlarge": frozenset({"us-east-1c", "us-east-1a"})}

    assert offered_zones(zones, "g5.xlarge", ["us-east-1a", "us-east-1b", "us-east-1c"]) == ["us-east-1a", "us-east-1c"]
    assert offered_zones(zones, "p7.48xlarge", ["us-east-1a", "us-east-1b"]) == ["us-east-1a", "us-east-1b"]


def test_the_snapshot_seen_from_one_region() -> None:
    east = in_region(SNAPSHOT, "us-east-1")

    assert east == {"p5e.48xlarge": frozenset(), "g5.xlarge": frozenset({"us-east-1a", "us-east-1b"})}
    assert not offered(east, "p5e.48xlarge", "us-east-1a")
    assert in_region(SNAPSHOT, "xx-nowhere-1") == {}  # a region the snapshot does not cover: all tried


def test_a_refusal_names_where_the_type_is_offered_nearest_first() -> None:
    refusal = not_offered_in_region(SNAPSHOT, instance_type="p5e.48xlarge", region="us-east-1")

    assert refusal == "p5e.48xlarge is not offered in us-east-1 (offered in: us-east-2, eu-north-1)"


def test_nothing_is_refused_that_the_snapshot_cannot_judge() -> None:
    assert not_offered_in_region(SNAPSHOT, instance_type="g5.xlarge", region="us-east-1") is None
    assert not_offered_in_region(SNAPSHOT, instance_type="p7.48xlarge", region="us-east-1") is None
    assert not_offered_in_region(SNAPSHOT, instance_type="p5e.48xlarge", region="xx-nowhere-1") is None


def test_a_long_list_of_regions_is_cut_and_counted() -> None:
    regions = {f"eu-west-{n}": frozenset({f"eu-west-{n}a"}) for n in range(1, 10)}
    snapshot = {"g6.xlarge": regions, "g5.xlarge": {"us-east-1": frozenset({"us-east-1a"})}}

    refusal = not_offered_in_region(snapshot, instance_type="g6.xlarge", region="us-east-1")

    assert refusal == (
        "g6.xlarge is not offered in us-east-1 (offered in: eu-west-1, eu-west-2, eu-west-3, eu-west-4, "
        "eu-west-5, eu-west-6 and 3 more)"
    )
