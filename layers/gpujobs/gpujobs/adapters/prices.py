"""Hourly instance prices for cost caps: on-demand from the Price List, spot from EC2.

Caps need the right order of magnitude, and when unsure they must err high. So:
- On-demand prices come from AWS's Price List for the stack's region (`adapters.price_list`,
  deployed), cached a day, erring high while unconfirmed; without it (tests, the CLI offline) from
  `gpujobs/data/ondemand_prices.json` (`adapters.catalog`), us-east-1 Linux list prices for the
  stack's default allow-list and common GPU types, read once. A type neither knows has no price
  here (None); a cost cap then counts it at the highest price of its family
  (`domain.cost.price_erring_high`), and submit refuses a `max_cost_usd` over such a type.
- Spot prices come from `describe_spot_price_history` at "now" for the zone, cached per (type, zone)
  for ten minutes (spot prices move slowly, and the reconciler asks for every job on every run).
  When EC2 knows no spot price, or cannot be asked, the on-demand price stands in.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from botocore.exceptions import BotoCoreError, ClientError

from gpujobs.adapters.catalog import on_demand_prices
from gpujobs.adapters.clock import UtcClock
from gpujobs.domain.job import Market
from gpujobs.service.ports import Clock

if TYPE_CHECKING:
    from types_boto3_ec2 import EC2Client
    from types_boto3_ec2.literals import InstanceTypeType
    from types_boto3_ec2.type_defs import DescribeSpotPriceHistoryRequestTypeDef

    from gpujobs.adapters.price_list import PriceListOnDemand

log = logging.getLogger(__name__)

SPOT_CACHE_TTL = timedelta(minutes=10)


def packaged_on_demand_prices() -> dict[str, float]:
    """Instance type -> on-demand USD per hour, from the packaged table (read once per process)."""
    return on_demand_prices()


class Ec2Prices:
    def __init__(
        self, *, client: EC2Client, clock: Clock | None = None, on_demand: PriceListOnDemand | None = None
    ) -> None:
        self._ec2 = client
        self._clock: Clock = clock or UtcClock()
        self._spot: dict[tuple[str, str | None], tuple[datetime, float | None]] = {}
        self._on_demand = on_demand

    @property
    def on_demand_table(self) -> dict[str, float]:
        """Instance type -> USD per hour: the Price List's as known now (without asking), else the packaged table."""
        return self._on_demand.table() if self._on_demand is not None else packaged_on_demand_prices()

    def hourly_usd(self, *, instance_type: str, market: Market, zone: str | None) -> float | None:
        """What an hour costs in the pool: a spot pool's spot price, the on-demand price (the Price
        List's, asked only here) for an on-demand pool or a spot pool EC2 knows no price for."""
        if market is Market.SPOT:
            spot = self.spot_usd(instance_type=instance_type, zone=zone)
            if spot is not None:
                return spot
        if self._on_demand is not None:
            return self._on_demand.usd(instance_type)
        return packaged_on_demand_prices().get(instance_type)

    def spot_usd(self, *, instance_type: str, zone: str | None) -> float | None:
        """The spot price in effect now (the highest over the region's zones when `zone` is None)."""
        key = (instance_type, zone)
        now = self._clock.now()
        cached = self._spot.get(key)
        if cached is not None and now - cached[0] < SPOT_CACHE_TTL:
            return cached[1]
        params: DescribeSpotPriceHistoryRequestTypeDef = {
            # The stubs list today's instance types as a Literal; EC2 takes any name (new types arrive first).
            "InstanceTypes": [cast("InstanceTypeType", instance_type)],
            "ProductDescriptions": ["Linux/UNIX"],
            "StartTime": now,
        }
        if zone:
            params["AvailabilityZone"] = zone
            params["MaxResults"] = 1
        try:
            history = self._ec2.describe_spot_price_history(**params)["SpotPriceHistory"]
        except (BotoCoreError, ClientError) as exc:  # not cached: the next call asks again
            log.warning("no spot price for %s in %s: %s", instance_type, zone or "any zone", exc)
            return None
        price = max((float(entry["SpotPrice"]) for entry in history), default=None)
        self._spot[key] = (now, price)
        return price
