"""Fault injection: EC2 refusing RunInstances for lack of capacity, the way a real pool runs dry.

moto always has capacity. `CapacityFaults` is a botocore `provide-client-params` hook on the
stack's RunInstances calls (every client the handlers make, see `MotoStack.on_aws`) that raises
the `ClientError` EC2 would (`InsufficientInstanceCapacity` by default) for each call matching an
injected fault by instance type, availability zone and market. The zone comes from the request's
placement or, as EC2 decides it, from its subnet. Faults stay until `clear()`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from gpujobs_local.stack import MotoStack


@dataclass(frozen=True)
class CapacityFault:
    """RunInstances calls to refuse; None matches anything, `market` is "spot" or "on-demand"."""

    instance_type: str | None
    zone: str | None
    market: str | None
    code: str


class CapacityFaults:
    """The faults injected so far, and the hook that enforces them (see the module docstring)."""

    def __init__(self) -> None:
        self._faults: list[CapacityFault] = []
        self._subnet_zones: dict[str, str] = {}
        self._lock = threading.Lock()

    def install(self, stack: MotoStack) -> None:
        """Enforce the faults on `stack`'s RunInstances calls."""
        described = stack.ec2.describe_subnets(SubnetIds=stack.subnets)["Subnets"]
        self._subnet_zones = {s["SubnetId"]: s["AvailabilityZone"] for s in described}
        stack.on_aws("provide-client-params.ec2.RunInstances", self.refuse)

    def inject(self, fault: CapacityFault) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def refuse(self, params: dict[str, Any], **_: Any) -> None:
        """The hook: raise EC2's capacity error if a fault matches this RunInstances request."""
        with self._lock:
            faults = list(self._faults)
        if not faults:
            return
        itype = params.get("InstanceType")
        interfaces: list[dict[str, Any]] = params.get("NetworkInterfaces", [])
        subnet = str(params.get("SubnetId") or (interfaces[0].get("SubnetId", "") if interfaces else ""))
        zone = params.get("Placement", {}).get("AvailabilityZone") or self._subnet_zones.get(subnet)
        market = "spot" if "InstanceMarketOptions" in params else "on-demand"
        for f in faults:
            if f.instance_type in (None, itype) and f.zone in (None, zone) and f.market in (None, market):
                raise ClientError(
                    {"Error": {"Code": f.code, "Message": f"local cloud: no {market} {itype} capacity in {zone}"}},
                    "RunInstances",
                )
