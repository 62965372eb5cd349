"""On-demand prices from AWS's Price List Query API (`pricing:GetProducts`), for the stack's region.

One request per instance type: Linux, shared tenancy, no pre-installed software, capacity status
Used, in the stack's region (`regionCode`); each answer is a JSON document per product, whose
`terms.OnDemand.*.priceDimensions.*` hold the hourly USD price. When several products match, the
highest price counts (a cap errs high). The API answers only from `us-east-1`, `eu-central-1` and
`ap-south-1`; the client asks the nearest (`price_list_region`).

An answer is fresh for `PRICE_LIST_TTL` (on-demand prices change rarely, and announced). A price
that is not fresh (no answer yet, a failed ask, a type the Price List does not list here) is
unconfirmed, and a cap counts it high: the higher of the last answer, however old, and the
packaged table's us-east-1 list price, which in any other region is first multiplied by
`UNCONFIRMED_MARKUP` (a region's price may be well above us-east-1's, and the table knows no
other). A failed ask is not repeated for `RETRY_AFTER`. Nothing here raises. The table read
without asking (`table`: what a job cost its team) is the best estimate instead: the last answer,
else the packaged price as is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from gpujobs.adapters.catalog import on_demand_prices
from gpujobs.adapters.clock import UtcClock
from gpujobs.service.ports import Clock

log = logging.getLogger(__name__)

PACKAGED_REGION = "us-east-1"
"""The region whose list prices the packaged table holds (`gpujobs/data/ondemand_prices.json`)."""
PRICE_LIST_TTL = timedelta(hours=24)
RETRY_AFTER = timedelta(hours=1)
UNCONFIRMED_MARKUP = 1.5
"""How much higher than its us-east-1 list price a cap counts a type whose price in another region
the Price List has not confirmed: an upper estimate on purpose, replaced by the first answer."""

_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}


class PricingClient(Protocol):
    """The one call of boto3's `pricing` client this adapter makes (no typed stubs are installed)."""

    def get_products(self, **request: Any) -> Mapping[str, Any]: ...


def price_list_region(region: str) -> str:
    """The Price List endpoint nearest `region` (it answers for every region from each)."""
    if region.startswith(("eu-", "me-", "af-", "il-")):
        return "eu-central-1"
    if region.startswith("ap-"):
        return "ap-south-1"
    return "us-east-1"


class PriceListOnDemand:
    """On-demand USD per hour per instance type in `region`: the Price List's, else unconfirmed (above)."""

    def __init__(
        self,
        *,
        client: PricingClient,
        region: str,
        clock: Clock | None = None,
        packaged: Callable[[], Mapping[str, float]] = on_demand_prices,
    ) -> None:
        self._pricing = client
        self._region = region
        self._clock: Clock = clock or UtcClock()
        self._packaged = packaged
        self._answers: dict[str, tuple[datetime, float | None]] = {}
        """Type -> when the Price List last answered for it, and its price (None: not listed here)."""
        self._last: dict[str, float] = {}
        """Type -> the last price the Price List gave, however old."""
        self._failed_at: datetime | None = None

    def usd(self, instance_type: str) -> float | None:
        """The type's price, asking the Price List when no fresh answer is kept."""
        now = self._clock.now()
        kept = self._answers.get(instance_type)
        if kept is not None and now - kept[0] < PRICE_LIST_TTL:
            return kept[1] if kept[1] is not None else self._unconfirmed(instance_type)
        if self._failed_at is None or now - self._failed_at >= RETRY_AFTER:
            try:
                price = self._ask(instance_type)
            except Exception as exc:  # a price source failing never fails a tick: the price is unconfirmed
                log.warning("the Price List did not answer for %s in %s (%s)", instance_type, self._region, exc)
                self._failed_at = now
            else:
                self._failed_at = None
                self._answers[instance_type] = (now, price)
                if price is not None:
                    self._last[instance_type] = price
                    return price
        return self._unconfirmed(instance_type)

    def table(self) -> dict[str, float]:
        """Every type with a price, without asking: the Price List's last answer, else the packaged
        price as is. The best estimate (for what a job cost its team), not a cap's (`usd`)."""
        return {**self._packaged(), **self._last}

    def _unconfirmed(self, instance_type: str) -> float | None:
        """The higher of the last answer and the (marked up, outside us-east-1) packaged price."""
        packaged = self._packaged().get(instance_type)
        if packaged is not None and self._region != PACKAGED_REGION:
            packaged *= UNCONFIRMED_MARKUP
        last = self._last.get(instance_type)
        return max((p for p in (last, packaged) if p is not None), default=None)

    def _ask(self, instance_type: str) -> float | None:
        filters = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type}]
        filters += [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": self._region}]
        filters += [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in _FILTERS.items()]
        request: dict[str, Any] = {
            "ServiceCode": "AmazonEC2",
            "Filters": filters,
            "FormatVersion": "aws_v1",
            "MaxResults": 100,
        }
        prices: list[float] = []
        while True:
            page = self._pricing.get_products(**request)
            for document in page.get("PriceList", []):
                prices += hourly_prices(document, instance_type)
            token = page.get("NextToken")
            if not token:
                return max(prices, default=None)
            request["NextToken"] = token


def hourly_prices(document: str | Mapping[str, Any], instance_type: str) -> list[float]:
    """The positive hourly USD prices of one Price List product document for `instance_type`."""
    product = json.loads(document) if isinstance(document, str) else document
    if product.get("product", {}).get("attributes", {}).get("instanceType") != instance_type:
        return []
    found = []
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if dimension.get("unit") == "Hrs" and usd is not None and float(usd) > 0:
                found.append(float(usd))
    return found
