"""EC2's spot placement scores per zone (GetSpotPlacementScores): the advice that ranks a ladder's
zones after the stack's own reclaims (`domain.pools`).

One request per job shape (its set of instance types and its node count): SingleAvailabilityZone,
the stack's region only, the node count as target capacity in units (instances), since a gang must
launch in one zone. EC2 answers with zone IDs (`use1-az4`), which DescribeAvailabilityZones maps to
this account's zone names (asked once: the mapping does not change).

AWS advises caching scores and may cap the request configurations an account makes new in 24 hours,
so each shape's answer is kept for `SCORES_TTL` and a failed ask (throttled, capped, the grant
missing) is not repeated for `RETRY_AFTER`; meanwhile the last answer stands, however old, or none.
This never raises: scores only order zones, and a launch never waits on them.

EC2 scores a request of one or two types low whatever the capacity (its documentation advises three
or more). Only the order of the zones is used, never the value itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpujobs.adapters.clock import UtcClock
from gpujobs.service.ports import Clock

if TYPE_CHECKING:
    from types_boto3_ec2 import EC2Client

log = logging.getLogger(__name__)

SCORES_TTL = timedelta(hours=1)
RETRY_AFTER = timedelta(minutes=15)

Shape = tuple[tuple[str, ...], int]


class Ec2PlacementScores:
    """`service.pool_evidence.PlacementScores` over EC2, for the region `client` is in."""

    def __init__(self, *, client: EC2Client, region: str, clock: Clock | None = None) -> None:
        self._ec2 = client
        self._region = region
        self._clock: Clock = clock or UtcClock()
        self._answers: dict[Shape, tuple[datetime, dict[str, int]]] = {}
        self._failed: dict[Shape, datetime] = {}
        self._zone_names: dict[str, str] | None = None

    def zone_scores(self, instance_types: Sequence[str], *, nodes: int) -> Mapping[str, int]:
        shape: Shape = (tuple(sorted(set(instance_types))), max(1, nodes))
        now = self._clock.now()
        kept = self._answers.get(shape)
        if kept is not None and now - kept[0] < SCORES_TTL:
            return kept[1]
        failed = self._failed.get(shape)
        if failed is not None and now - failed < RETRY_AFTER:
            return kept[1] if kept is not None else {}
        try:
            scores = self._ask(shape)
        except Exception as exc:  # advice only: any failure ranks by the last answer or none
            log.warning("no spot placement scores for %s x%d (%s); ranking without new ones", shape[0], shape[1], exc)
            self._failed[shape] = now
            return kept[1] if kept is not None else {}
        self._answers[shape] = (now, scores)
        self._failed.pop(shape, None)
        return scores

    def _ask(self, shape: Shape) -> dict[str, int]:
        types, nodes = shape
        names = self._names()
        scores: dict[str, int] = {}
        request: dict[str, Any] = {
            "InstanceTypes": list(types),
            "TargetCapacity": nodes,
            "TargetCapacityUnitType": "units",
            "SingleAvailabilityZone": True,
            "RegionNames": [self._region],
            "MaxResults": 100,
        }
        while True:
            page = self._ec2.get_spot_placement_scores(**request)
            for entry in page.get("SpotPlacementScores", []):
                zone = names.get(entry.get("AvailabilityZoneId", ""))
                if zone is not None and entry.get("Region", self._region) == self._region and "Score" in entry:
                    scores[zone] = max(scores.get(zone, 0), int(entry["Score"]))
            token = page.get("NextToken")
            if not token:
                return scores
            request["NextToken"] = token

    def _names(self) -> dict[str, str]:
        """Zone ID -> zone name in this account (IDs name the same place in every account; names do not)."""
        if self._zone_names is None:
            zones = self._ec2.describe_availability_zones()["AvailabilityZones"]
            self._zone_names = {z["ZoneId"]: z["ZoneName"] for z in zones if "ZoneId" in z and "ZoneName" in z}
        return self._zone_names
