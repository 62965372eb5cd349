"""Where EC2 offers each instance type, asked of EC2 itself, with the bundled snapshot behind it.

DescribeInstanceTypeOfferings (LocationType availability-zone, filtered by the types asked about)
answers for this account and region, which the snapshot in `gpujobs/data/instance_types.json`
cannot: offerings differ between accounts and grow after the snapshot was generated. Each type's
answer is kept for six hours (offerings change over months; a launch asks on every ladder walk).

When EC2 cannot be asked (throttled, the grant missing, an outage), a type's last answer stands in
if there is one, however old, else the snapshot's zones for this region, else nothing: the type is
then undescribed and counts as offered (`domain.offerings`). Nothing from a failed call is cached,
so the next call asks again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from botocore.exceptions import BotoCoreError, ClientError

from gpujobs.adapters.catalog import packaged_offerings
from gpujobs.adapters.clock import UtcClock
from gpujobs.domain.offerings import RegionOfferings, in_region
from gpujobs.service.ports import Clock

if TYPE_CHECKING:
    from types_boto3_ec2 import EC2Client
    from types_boto3_ec2.literals import InstanceTypeType

log = logging.getLogger(__name__)

OFFERINGS_TTL = timedelta(hours=6)
_TYPES_PER_CALL = 100
"""Instance types per filter: an allow-list is a handful; a longer one is asked in several calls."""


class Ec2InstanceTypeOfferings:
    """`service.offerings.InstanceTypeOfferings` over EC2, for the region `client` is in."""

    def __init__(
        self,
        *,
        client: EC2Client,
        region: str,
        clock: Clock | None = None,
        bundled: Callable[[], RegionOfferings] = packaged_offerings,
    ) -> None:
        self._ec2 = client
        self._region = region
        self._clock: Clock = clock or UtcClock()
        self._bundled = bundled
        self._answers: dict[str, tuple[datetime, frozenset[str]]] = {}

    def zones_offering(self, instance_types: Collection[str]) -> dict[str, frozenset[str]]:
        now = self._clock.now()
        stale = sorted(
            {t for t in instance_types if t not in self._answers or now - self._answers[t][0] >= OFFERINGS_TTL}
        )
        if stale:
            try:
                found = self._ask(stale)
            except (BotoCoreError, ClientError) as exc:
                log.warning("EC2 did not say where %s are offered (%s); using older answers", ", ".join(stale), exc)
                return self._fallback(instance_types)
            for name in stale:
                self._answers[name] = (now, frozenset(found.get(name, ())))
        return {name: self._answers[name][1] for name in instance_types}

    def _ask(self, instance_types: Sequence[str]) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        paginator = self._ec2.get_paginator("describe_instance_type_offerings")
        for start in range(0, len(instance_types), _TYPES_PER_CALL):
            # The stubs list today's instance types as a Literal; EC2 takes any name (new types arrive first).
            chunk = [cast("InstanceTypeType", t) for t in instance_types[start : start + _TYPES_PER_CALL]]
            pages = paginator.paginate(
                LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": chunk}]
            )
            for page in pages:
                for offer in page.get("InstanceTypeOfferings", []):
                    if "InstanceType" in offer and "Location" in offer:
                        found.setdefault(offer["InstanceType"], set()).add(offer["Location"])
        return found

    def _fallback(self, instance_types: Collection[str]) -> dict[str, frozenset[str]]:
        """Each type's last answer, else the snapshot's zones in this region; a type neither knows is left out."""
        snapshot = in_region(self._bundled(), self._region)
        answers: dict[str, frozenset[str]] = {}
        for name in instance_types:
            if name in self._answers:
                answers[name] = self._answers[name][1]
            elif name in snapshot:
                answers[name] = snapshot[name]
        return answers
