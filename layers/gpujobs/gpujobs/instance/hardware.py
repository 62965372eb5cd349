"""This host's network and storage, as the workload needs them: the primary interface, EFA devices, staging.

- **Primary interface.** With `--network host` the container sees every interface of the host:
  docker0 (the bridge), one per EFA card on p4d/p5, loopback. Left alone, gloo binds the first one
  its hostname resolves to, which on a DLAMI may be docker0, and the ranks of other nodes never
  reach it. The interface that holds the private IP IMDS reports is the one the rendezvous used, so
  the workload is told to use it (`NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME`). Found with the stdlib:
  the kernel's interface list and one `SIOCGIFADDR` ioctl per interface.
- **EFA devices.** An instance launched with EFA interfaces exposes one `/dev/infiniband/uverbsN`
  per interface once the EFA driver (DLAMI, or the EFA installer) is loaded; the container gets each.
- **Checkpoint staging.** On a type with an NVMe instance store, the DLAMI mounts it at
  `INSTANCE_STORE_MOUNT`: checkpoints stage there (several GB/s), else on the root volume.
"""

from __future__ import annotations

import fcntl
import glob
import os
import socket
import struct
from typing import Any

EFA_DEVICE_GLOB = "/dev/infiniband/uverbs*"
INSTANCE_STORE_MOUNT = "/opt/dlami/nvme"
"""Where the DLAMI mounts the instance store (its release notes' `nvme_location`)."""
SOCKET_INTERFACE_ENVS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915
_IFNAMSIZ = 16


def interface_addresses() -> dict[str, str]:
    """Interface name -> its (first) IPv4 address, for the interfaces that have one."""
    found: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _index, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[: _IFNAMSIZ - 1])
            try:
                reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address (an efa-only or down interface)
                continue
            found[name] = socket.inet_ntoa(reply[20:24])
    return found


def interface_holding(ip: str, addresses: dict[str, str]) -> str | None:
    """The name of the interface whose address is `ip`, or None when no interface holds it."""
    return next((name for name, address in sorted(addresses.items()) if address == ip), None)


def efa_devices(doc: dict[str, Any], instance_type: str, pattern: str = EFA_DEVICE_GLOB) -> list[str]:
    """The uverbs devices to pass to the container: this host's, if the document launched its type with EFA."""
    if instance_type not in doc["efa_instance_types"]:
        return []
    return sorted(glob.glob(pattern))


def staging_base(doc: dict[str, Any], instance_type: str, mount: str = INSTANCE_STORE_MOUNT) -> str | None:
    """The instance store's mount point when this type has one and it is mounted, else None (the root volume)."""
    if instance_type in doc["instance_store_types"] and os.path.ismount(mount):
        return mount
    return None
