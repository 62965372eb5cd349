"""What an instance type's hardware asks of a launch: EFA interfaces and where checkpoints stage.

A multi-node gang on an EFA-capable type (p4d.24xlarge: 4 network cards, p5.48xlarge: 32) runs its
collectives at the fabric's speed only when every network card carries an EFA interface; with the
plain interface EC2 gives by default, NCCL falls back to TCP on one card. The layout follows the EC2
guide for multi-card types: card 0 device 0 is the primary interface, an `efa` one (EFA with ENA:
it holds the private IP the rendezvous and NCCL's TCP bootstrap use); every other card takes one
`efa` interface at device index 1. EFA's OS-bypass traffic never leaves its subnet, which the gang
shares anyway (one rung, one subnet), and the job's self-ingress security group admits it.
A single node talks over NVLink/PCIe only, so it launches with the one plain interface as before.

A multi-node gang launched with EFA first measures its all-reduce bus bandwidth (the launcher,
`gpujobs_trainer.interconnect`) against a floor of `INTERCONNECT_FLOOR_SHARE` of that fabric's
documented bandwidth: far above what NCCL gets when it silently falls back to TCP on one card (a
missing aws-ofi-nccl, an EFA down), far enough below the fabric's figure that a short run on good
hosts meets it. A gang below it is relaunched on other hosts (`ExitCode.SLOW_INTERCONNECT`). Without
EFA there is no documented figure for NCCL's TCP transport, so such gangs measure and log only, as
does the attempt after `INTERCONNECT_RELAUNCHES` slow gangs in a row (then the image's NCCL setup or
the type, not the hosts, is the likelier cause, and the job trains at what it gets rather than failing).

Types with an NVMe instance store stage checkpoints there (the DLAMI mounts it at /opt/dlami/nvme,
`gpujobs.instance.hardware`); the others stage on the root volume, whose gp3 throughput and IOPS the
launch template raises. The facts per type are a packaged table (`adapters.catalog`); these rules
are pure so they are tested per type without EC2.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class InstanceHardware:
    efa_interfaces: int
    """EFA interfaces the type takes, one per network card; 0 when it has no EFA."""
    instance_store_gb: int
    """NVMe instance store size; 0 when it has none."""
    gpus: int = 0
    """GPUs the type has: what a node's GPU check expects nvidia-smi to see (`gpujobs.instance.gpu_health`)."""
    fabric_gbps: float = 0.0
    """The documented bandwidth of the fabric a multi-node gang of the type gets: its network cards'
    baseline together when every card carries an EFA interface; 0 when it launches without EFA."""


INTERCONNECT_FLOOR_SHARE = 0.25
"""The share of the fabric's documented bandwidth a gang's all-reduce bus bandwidth must reach."""
INTERCONNECT_RELAUNCHES = 2
"""Gangs in a row found below the floor after which the next one measures and logs only."""


class InterfaceType(StrEnum):
    PLAIN = "interface"
    EFA = "efa"
    """EFA with ENA: an IP address for TCP plus the OS-bypass device."""


@dataclass(frozen=True)
class NetworkInterface:
    """One entry of RunInstances' `NetworkInterfaces`; the adapter adds subnet and security groups."""

    network_card_index: int
    device_index: int
    interface_type: InterfaceType


def efa_interfaces(hardware: Mapping[str, InstanceHardware], *, instance_type: str, nodes: int) -> int:
    """How many EFA interfaces each instance of this gang gets: one per card on an EFA type, for multi-node only."""
    facts = hardware.get(instance_type)
    return facts.efa_interfaces if facts is not None and nodes > 1 else 0


def network_interfaces(efa_count: int) -> tuple[NetworkInterface, ...]:
    """The launch's interfaces: one plain primary, or an EFA on every network card (device 1 beyond card 0)."""
    if efa_count <= 0:
        return (NetworkInterface(0, 0, InterfaceType.PLAIN),)
    primary = NetworkInterface(0, 0, InterfaceType.EFA)
    return (primary, *(NetworkInterface(card, 1, InterfaceType.EFA) for card in range(1, efa_count)))


def efa_instance_types(
    hardware: Mapping[str, InstanceHardware], *, instance_types: Iterable[str], nodes: int
) -> list[str]:
    """Of the types a job may launch on, those it would launch with EFA (its run document names them)."""
    return [t for t in instance_types if efa_interfaces(hardware, instance_type=t, nodes=nodes) > 0]


def instance_store_types(hardware: Mapping[str, InstanceHardware], *, instance_types: Iterable[str]) -> list[str]:
    """Of the types a job may launch on, those whose NVMe instance store stages its checkpoints."""
    return [t for t in instance_types if (facts := hardware.get(t)) is not None and facts.instance_store_gb > 0]


def gpu_counts(hardware: Mapping[str, InstanceHardware], *, instance_types: Iterable[str]) -> dict[str, int]:
    """Of the types a job may launch on, the GPUs of each known GPU type (its run document names them)."""
    return {t: facts.gpus for t in instance_types if (facts := hardware.get(t)) is not None and facts.gpus > 0}


def interconnect_floors(
    hardware: Mapping[str, InstanceHardware], *, instance_types: Iterable[str], nodes: int
) -> dict[str, float]:
    """Of the types a job may launch on, the all-reduce floor in GB/s of each one a gang of `nodes`
    launches with EFA (the run document names them; a type left out measures and logs only)."""
    floors = {}
    for name in efa_instance_types(hardware, instance_types=instance_types, nodes=nodes):
        fabric = hardware[name].fabric_gbps
        if fabric > 0:
            floors[name] = round(fabric / 8 * INTERCONNECT_FLOOR_SHARE, 3)
    return floors
