"""How the job's container is confined: its `docker run` options, and IMDS refused to its control group.

The job's image is the job's own, so whatever it holds runs: a setuid-root binary included. Before
this, the container ran with docker's default capabilities and without `no-new-privileges`, and the
only IMDS block was an iptables `owner` rule for uid 10001: a setuid-root binary in the image became
euid 0, which that rule does not match, and read the instance role's credentials from IMDS (IPv4,
or IPv6 `fd00:ec2::254`, which had no rule at all). Now, in layers that each stop it:

* `OPTIONS`: `--security-opt no-new-privileges` (a setuid or file-capability binary gains nothing
  on exec), `--cap-drop ALL` with nothing added back (`CAPABILITIES_ADDED`; the workload runs as uid
  10001, which holds no capability anyway, so dropping the bounding set costs training nothing and
  leaves nothing to regain), and `--pids-limit` (a fork bomb stays inside the container). Docker's
  default seccomp profile applies: the bootstrap never passes `seccomp=unconfined`, and refuses a
  daemon that reports seccomp off or unconfined (`check_daemon`).
* IMDS is refused by what the container *is*, not by its uid: the container runs in its own control
  group (`--cgroup-parent`, a systemd slice or a cgroupfs folder, by docker's cgroup driver), and
  iptables and ip6tables reject every packet from that group's sockets to 169.254.169.254 and
  fd00:ec2::254 (`-m cgroup --path`, a cgroup v2 match). With `--network host` the container's
  packets leave from the host's own network namespace, so they pass OUTPUT like the host's; the
  bootstrap, the host agent, dockerd and the agents live in other groups and keep IMDS.
  The rule names the group as it exists when the rule is made (the kernel resolves the path
  then), so the group is made first and nothing removes it while the attempt runs.

Every failure here fails the bootstrap before `docker run`: the container would otherwise reach the
instance role. A host with no IPv6 stack (`/proc/net/if_inet6` absent) has no route to the IPv6
endpoint, so it gets the IPv4 rule only. docs/security.md ("The container") says what the runc test
proves and what it does not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from gpujobs.instance.errors import BootstrapError

IMDS_ADDRESSES = (("iptables", "169.254.169.254"), ("ip6tables", "fd00:ec2::254"))
"""EC2's instance metadata service, by the tool that filters each address family."""
CGROUP_NAME = "gpujobs"
"""The container's control group: `gpujobs.slice` (systemd driver) or `/gpujobs` (cgroupfs)."""
PIDS_LIMIT = 65536
"""Tasks (threads count) the container may hold: far above 8 ranks x (data-loader workers +
NCCL, CUDA and OpenMP threads), far below the host's pid_max, so a fork bomb stops inside."""
CAPABILITIES_ADDED: tuple[str, ...] = ()
"""Capabilities added back after `--cap-drop ALL`: none. The workload's uid 10001 has no effective
capability; memlock and devices (EFA) are granted by `--ulimit`/`--device`, the GPUs by the NVIDIA
runtime's hook on the host, neither through the container's capabilities."""
OPTIONS = ("--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--pids-limit", str(PIDS_LIMIT))
"""`docker run` options every job's container gets."""
DAEMON_FORMAT = "{{.CgroupDriver}} {{.CgroupVersion}} {{json .SecurityOptions}}"
"""What `docker info --format` reports of the daemon for `check_daemon`."""


def check_daemon(info: str) -> str:
    """The daemon's cgroup driver, from `docker info --format DAEMON_FORMAT`; refused unless it runs
    containers under cgroup v2 (the `cgroup` match) and with seccomp on and not unconfined."""
    driver, _, rest = info.strip().partition(" ")
    version, _, options_json = rest.partition(" ")
    try:
        options = [str(option) for option in json.loads(options_json)]
    except ValueError:
        raise BootstrapError(f"cannot read docker info {info.strip()[:200]!r}") from None
    if driver not in ("systemd", "cgroupfs"):
        raise BootstrapError(f"docker's cgroup driver {driver!r} is neither systemd nor cgroupfs")
    if version != "2":
        raise BootstrapError(f"docker runs containers under cgroup v{version}: the IMDS rule needs cgroup v2")
    seccomp = [o for o in options if o.startswith("name=seccomp")]
    if not seccomp or any("profile=unconfined" in o for o in seccomp):
        raise BootstrapError(f"docker runs containers without a seccomp profile ({options}): refused")
    return driver


def cgroup_parent(driver: str, name: str = CGROUP_NAME) -> tuple[str, str]:
    """(`docker run --cgroup-parent` value, its path below the cgroup v2 root) for `driver`."""
    return (f"{name}.slice", f"/{name}.slice") if driver == "systemd" else (f"/{name}", f"/{name}")


def cgroup2_root(mounts: str = "/proc/self/mounts") -> str:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup on a unified host)."""
    with open(mounts, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return fields[1]
    raise BootstrapError("no cgroup v2 hierarchy is mounted: the IMDS rule needs one")


def make_cgroup(driver: str, path: str, *, root: str, systemctl: str = "systemctl") -> None:
    """Make the container's group before the rule names it: a started slice (systemd drops an
    empty slice only when it is stopped) or a folder (cgroupfs; docker makes the container's below)."""
    folder = os.path.join(root, path.lstrip("/"))
    if driver == "systemd":
        done = subprocess.run([systemctl, "start", path.lstrip("/")], capture_output=True, check=False)
        if done.returncode != 0:
            raise BootstrapError(f"cannot start {path.lstrip('/')}: {done.stderr.decode(errors='replace')[-300:]}")
    else:
        os.makedirs(folder, exist_ok=True)
    if not os.path.isdir(folder):
        raise BootstrapError(f"the container's control group {folder} does not exist")


def imds_rules(path: str) -> list[tuple[str, list[str]]]:
    """(tool, rule) refusing every packet of group `path`'s sockets to IMDS, IPv4 and IPv6."""
    return [
        (tool, ["OUTPUT", "-d", address, "-m", "cgroup", "--path", path, "-j", "REJECT"])
        for tool, address in IMDS_ADDRESSES
    ]


def has_ipv6() -> bool:
    """Whether the kernel has an IPv6 stack, without which fd00:ec2::254 cannot be reached."""
    return os.path.exists("/proc/net/if_inet6")


def install_rules(rules: list[tuple[str, list[str]]], tools: dict[str, str]) -> None:
    """Insert each rule unless present (`-C` first), with `tools[tool]` as the binary."""
    for tool, rule in rules:
        binary = shutil.which(tools[tool]) or tools[tool]
        try:
            present = subprocess.run([binary, "-C", *rule], capture_output=True, check=False).returncode == 0
            done = None if present else subprocess.run([binary, "-I", *rule], capture_output=True, check=False)
        except OSError as exc:
            raise BootstrapError(f"{tool}: {exc.strerror}") from None
        if done is not None and done.returncode != 0:
            raise BootstrapError(f"{tool}: {done.stderr.decode(errors='replace')[-300:].strip()}")
