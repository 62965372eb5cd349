"""Where EC2 offers an instance type: which zones, and so which regions.

Not every zone offers every type (p5e.48xlarge is in three of us-east-2's zones and none of
us-east-1's), and a launch in a zone that does not offer the type fails with `Unsupported`, a try
wasted per rung. Two sources say where a type is offered, both handed here as plain mappings:
EC2's DescribeInstanceTypeOfferings at run time (`adapters.offerings`, the authority) and the
snapshot bundled in `gpujobs/data/instance_types.json` (generated from EC2's data as moto ships it,
`scripts/generate_catalog.py`), which `gpujobs validate` reads offline and the adapter falls back to.

What no source describes counts as offered: a type newer than the snapshot, or a region it does not
cover, is left for EC2 to accept or refuse. A snapshot must never be the reason a launch is not
tried; it may only spare one that is sure to fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ZoneOfferings = Mapping[str, frozenset[str]]
"""Instance type -> the zones that offer it (of one region, as the launcher asks; an empty set: none
of them). A type not in the mapping is one nobody described: `offered` says yes."""

RegionOfferings = Mapping[str, Mapping[str, frozenset[str]]]
"""Instance type -> region -> the zones of that region that offer it: the bundled snapshot, all regions."""


def offered(offerings: ZoneOfferings, instance_type: str, zone: str) -> bool:
    """Whether `zone` offers `instance_type`; True for a type `offerings` does not describe."""
    zones = offerings.get(instance_type)
    return zones is None or zone in zones


def offered_zones(offerings: ZoneOfferings, instance_type: str, zones: Iterable[str]) -> list[str]:
    """Of `zones`, in their order, those that offer `instance_type` (all of them for an undescribed type)."""
    return [zone for zone in zones if offered(offerings, instance_type, zone)]


def in_region(offerings: RegionOfferings, region: str) -> dict[str, frozenset[str]]:
    """The snapshot as one region's `ZoneOfferings`: every type it describes, with the region's zones
    that offer it (an empty set: offered elsewhere only). A region the snapshot does not cover at all
    gives an empty mapping, so every type counts as offered there."""
    if not any(region in regions for regions in offerings.values()):
        return {}
    return {name: frozenset(regions.get(region, ())) for name, regions in offerings.items()}


REGIONS_NAMED = 6
"""Regions a refusal names (nearest first), so that it stays one readable line; the rest are counted."""


def not_offered_in_region(offerings: RegionOfferings, *, instance_type: str, region: str) -> str | None:
    """The refusal of a type no zone of `region` offers, naming the regions that do, those of the
    same geography first (`us-` for us-east-1); None when the region offers it, or when the
    snapshot describes the type or the region not at all."""
    regions = offerings.get(instance_type)
    if regions is None or regions.get(region) or not any(region in other for other in offerings.values()):
        return None
    area = region.partition("-")[0]
    elsewhere = sorted((name for name, zones in regions.items() if zones), key=lambda r: (not r.startswith(area), r))
    if not elsewhere:
        return f"{instance_type} is not offered in {region} (no region offers it)"
    named = ", ".join(elsewhere[:REGIONS_NAMED])
    more = f" and {len(elsewhere) - REGIONS_NAMED} more" if len(elsewhere) > REGIONS_NAMED else ""
    return f"{instance_type} is not offered in {region} (offered in: {named}{more})"
