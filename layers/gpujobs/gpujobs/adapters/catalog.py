"""The instance types gpujobs knows: EC2's own facts about each, and list prices where known.

Two packaged tables, each read once per process:
- `gpujobs/data/instance_types.json`, generated from EC2's DescribeInstanceTypes and
  DescribeInstanceTypeOfferings as moto bundles them (`scripts/generate_catalog.py`; never edited by
  hand, a test regenerates it and compares): every type with GPUs, plus the priced CPU types, with
  GPUs, GPU model and memory, vCPUs, memory, EFA interfaces, network cards, instance store,
  architectures, and per region the zones that offer it. `gpujobs validate` checks a spec's types
  and `gpus_per_node` against it offline; the launcher reads each type's EFA and instance store
  (`domain.hardware`) and where it is offered (`domain.offerings`) from it.
- `gpujobs/data/ondemand_prices.json`: us-east-1 list prices, transcribed by hand, for fewer types.
  A catalogued type without a price validates and launches; only a `max_cost_usd` over it is refused,
  and estimates count it high (`domain.cost.price_erring_high`, scaled by `instance_sizes`).

Reading them needs no AWS and no botocore, so the CLI imports this module without paying boto3's
import time.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from gpujobs.domain.cost import InstanceSize
from gpujobs.domain.hardware import InstanceHardware

CATALOG_FILE = "data/instance_types.json"
PRICES_FILE = "data/ondemand_prices.json"


@dataclass(frozen=True)
class InstanceTypeFacts:
    """One type as EC2 describes it, with its list price when the price table has one."""

    gpus: int
    """GPUs the instance shows its OS (one for a fractional type, whose `gpu_partition` is below 1)."""
    gpu_model: str | None
    gpu_manufacturer: str | None
    gpu_memory_mib: int
    """All its GPUs' memory together."""
    vcpus: int
    memory_mib: int
    efa_interfaces: int
    """NetworkInfo.EfaInfo.MaximumEfaInterfaces; 0 without EFA."""
    network_cards: int
    instance_store_gb: int
    architectures: tuple[str, ...]
    hourly_usd: float | None
    """us-east-1 on-demand list price, USD per instance-hour; None when the price table lacks the type."""
    gpu_partition: float = 1.0
    """The share of one GPU a fractional type (g6f) has; 1 otherwise."""
    network_gbps: float = 0.0
    """Its network cards' BaselineBandwidthInGbps together."""


class CatalogError(ValueError):
    """The packaged tables disagree: a type priced that the generated catalog does not describe."""


def _read(name: str) -> Any:
    return json.loads(resources.files("gpujobs").joinpath(name).read_text(encoding="utf-8"))


@functools.cache
def on_demand_prices() -> dict[str, float]:
    """Instance type -> on-demand USD per hour, for the types the price table names."""
    return {name: float(price) for name, price in _read(PRICES_FILE)["prices"].items()}


@functools.cache
def _catalog_data() -> Any:
    return _read(CATALOG_FILE)


@functools.cache
def packaged_catalog() -> dict[str, InstanceTypeFacts]:
    """Instance type -> its facts, for every type the generated catalog describes."""
    types, prices = _catalog_data()["types"], on_demand_prices()
    unknown = sorted(set(prices) - set(types))
    if unknown:
        raise CatalogError(f"{PRICES_FILE} prices {unknown}, which {CATALOG_FILE} does not describe: regenerate it")
    return {
        name: InstanceTypeFacts(
            gpus=int(facts["gpus"]),
            gpu_model=facts["gpu_model"],
            gpu_manufacturer=facts["gpu_manufacturer"],
            gpu_memory_mib=int(facts["gpu_memory_mib"]),
            vcpus=int(facts["vcpus"]),
            memory_mib=int(facts["memory_mib"]),
            efa_interfaces=int(facts["efa_interfaces"]),
            network_cards=int(facts["network_cards"]),
            instance_store_gb=int(facts["instance_store_gb"]),
            architectures=tuple(facts["architectures"]),
            hourly_usd=prices.get(name),
            gpu_partition=float(facts.get("gpu_partition", 1.0)),
            network_gbps=float(facts.get("network_gbps", 0.0)),
        )
        for name, facts in types.items()
    }


@functools.cache
def gpu_counts() -> dict[str, int]:
    """Instance type -> GPUs per instance, for every catalogued type."""
    return {name: facts.gpus for name, facts in packaged_catalog().items()}


@functools.cache
def instance_sizes() -> dict[str, InstanceSize]:
    """Instance type -> what its price grows with, for `price_erring_high`'s estimate of an unpriced type."""
    return {
        name: InstanceSize(
            vcpus=facts.vcpus, memory_mib=facts.memory_mib, gpus=facts.gpus, gpu_memory_mib=facts.gpu_memory_mib
        )
        for name, facts in packaged_catalog().items()
    }


@functools.cache
def packaged_hardware() -> dict[str, InstanceHardware]:
    """Instance type -> its EFA interfaces and instance store, for every catalogued type.

    `domain.hardware.network_interfaces` puts one EFA interface on each network card from card 0. A
    type with more cards than EFA interfaces does not take that layout (p6-b300.48xlarge: 17 cards,
    card 0 ENA only, EFA on cards 1 to 16), so it gets no EFA here and launches with the one plain
    interface, as a type outside the catalog does, rather than with a layout EC2 refuses."""
    return {
        name: InstanceHardware(
            efa_interfaces=(efa := facts.efa_interfaces if facts.efa_interfaces == facts.network_cards else 0),
            instance_store_gb=facts.instance_store_gb,
            gpus=facts.gpus,
            fabric_gbps=facts.network_gbps if efa else 0.0,
        )
        for name, facts in packaged_catalog().items()
    }


@functools.cache
def packaged_offerings() -> dict[str, dict[str, frozenset[str]]]:
    """Instance type -> region -> the zones offering it, as EC2's data bundled here says
    (`domain.offerings.RegionOfferings`: what `validate` checks a region against, what the launcher's
    offerings fall back to when EC2 cannot be asked)."""
    return {
        name: {region: frozenset(zones) for region, zones in regions.items()}
        for name, regions in _catalog_data()["zones"].items()
    }
