"""EC2's spot placement scores for moto, which implements none (moto 5.2.5 raises NotImplementedError,
and its server answers 500, which botocore retries for seconds on every ladder walk).

Answered through a botocore hook, in EC2's shape: a request for single-zone scores in this region
gets every zone of the region by zone ID. moto has no spot capacity to forecast from, so every zone
gets the same score and a ladder keeps the subnets' order (`domain.pools`); a region-level request,
or one for another region, gets that region's one score.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.awsrequest import AWSResponse

from gpujobs_local.placement_groups import PARAMS_KEY, Hook, keep_params, ok

SCORE = 5
"""Every zone's score: the middle of EC2's 1 to 10, the same everywhere."""


@dataclass
class SpotScores:
    region: str
    asked: int = 0
    _zone_ids: list[str] | None = None

    def install(self, register: Callable[[str, Hook], None]) -> None:
        register("before-parameter-build.ec2.GetSpotPlacementScores", keep_params)
        register("before-call.ec2.GetSpotPlacementScores", self._scores)

    def _scores(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        params = context[PARAMS_KEY]
        self.asked += 1
        regions = params.get("RegionNames") or [self.region]
        if not params.get("SingleAvailabilityZone"):
            return ok({"SpotPlacementScores": [{"Region": r, "Score": SCORE} for r in regions]})
        zones = self._zones() if self.region in regions else []
        return ok(
            {"SpotPlacementScores": [{"Region": self.region, "AvailabilityZoneId": z, "Score": SCORE} for z in zones]}
        )

    def _zones(self) -> list[str]:
        if self._zone_ids is None:
            described = boto3.client("ec2", region_name=self.region).describe_availability_zones()
            self._zone_ids = [z["ZoneId"] for z in described["AvailabilityZones"]]
        return self._zone_ids
