"""The port of where EC2 offers each instance type, in the stack's region (`domain.offerings`).

Deployed, it is EC2's DescribeInstanceTypeOfferings, cached and falling back to the bundled snapshot
(`adapters.offerings.Ec2InstanceTypeOfferings`); in tests, `gpujobs_fakes.offerings.FakeOfferings`.
A stack wired without one describes no type, so every (type, zone) counts as offered and EC2 alone
refuses a launch in a zone without the type, as before.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpujobs.domain.offerings import ZoneOfferings


class InstanceTypeOfferings(Protocol):
    def zones_offering(self, instance_types: Collection[str]) -> ZoneOfferings:
        """Each of `instance_types` -> the zones of the stack's region that offer it (an empty set:
        none); a type left out is undescribed, and `domain.offerings.offered` lets it be tried."""
        ...


class UndescribedOfferings:
    """No source of offerings: every type is left out, so every (type, zone) counts as offered."""

    def zones_offering(self, instance_types: Collection[str]) -> ZoneOfferings:  # noqa: ARG002 - none described
        return {}
