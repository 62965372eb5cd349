"""The instance types gpujobs knows: list price and GPU count, from one packaged table.

`gpujobs/data/ondemand_prices.json` holds both, keyed by the same types, so the price table is
also the catalog of types: the cost caps and the CLI's cost figures read the prices, and
`gpujobs validate` reads the GPU counts to catch, offline, a type nobody knows or a
`gpus_per_node` larger than the type has. Reading it needs no AWS and no botocore, so the CLI
imports this module without paying boto3's import time.

`gpujobs/data/instance_hardware.json` is the same catalog's hardware half: each type's EFA
interfaces and NVMe instance store (`gpujobs.domain.hardware` decides the launch from them). It
names exactly the priced types, so a type added to one table and not the other fails loudly.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

from gpujobs.domain.hardware import InstanceHardware

CATALOG_FILE = "data/ondemand_prices.json"
HARDWARE_FILE = "data/instance_hardware.json"


@dataclass(frozen=True)
class InstanceTypeFacts:
    hourly_usd: float
    """us-east-1 on-demand list price, USD per instance-hour."""
    gpus: int


class CatalogError(ValueError):
    """The packaged table is inconsistent (a type with a price and no GPU count, or the reverse)."""


@functools.cache
def packaged_catalog() -> dict[str, InstanceTypeFacts]:
    """Instance type -> its facts, read once per process."""
    text = resources.files("gpujobs").joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    prices, gpus = data["prices"], data["gpus"]
    if set(prices) != set(gpus):
        raise CatalogError(
            f"{CATALOG_FILE}: types with a price and no GPU count or the reverse: {set(prices) ^ set(gpus)}"
        )
    return {name: InstanceTypeFacts(hourly_usd=float(prices[name]), gpus=int(gpus[name])) for name in prices}


@functools.cache
def on_demand_prices() -> dict[str, float]:
    """Instance type -> on-demand USD per hour."""
    return {name: facts.hourly_usd for name, facts in packaged_catalog().items()}


@functools.cache
def gpu_counts() -> dict[str, int]:
    """Instance type -> GPUs per instance."""
    return {name: facts.gpus for name, facts in packaged_catalog().items()}


@functools.cache
def packaged_hardware() -> dict[str, InstanceHardware]:
    """Instance type -> its EFA interfaces and instance store, for exactly the catalog's types."""
    text = resources.files("gpujobs").joinpath(HARDWARE_FILE).read_text(encoding="utf-8")
    types = json.loads(text)["types"]
    if set(types) != set(packaged_catalog()):
        raise CatalogError(
            f"{HARDWARE_FILE} and {CATALOG_FILE} name different types: {set(types) ^ set(packaged_catalog())}"
        )
    return {
        name: InstanceHardware(
            efa_interfaces=int(facts["efa_interfaces"]), instance_store_gb=int(facts["instance_store_gb"])
        )
        for name, facts in types.items()
    }
