"""`docker run ARGS IMAGE COMMAND...` as the OCI runtime spec dockerd would hand runc, for the runc test.

Only the options the bootstrap emits (today's and before this change) are understood; any other
option raises, so an option added to `DockerRuntime.start` cannot be silently left out of the
proof. What dockerd adds by default is written here from moby's defaults (`oci/defaults.go`,
`oci/caps/defaults.go`, `daemon/oci_linux.go`):

* capabilities: docker's 14 defaults, tweaked by `--cap-drop`/`--cap-add`; for a non-root `--user`
  dockerd sets the bounding set only (execve would clear the others), so a setuid-root binary
  gets the bounding set back unless `no-new-privileges` is on;
* `noNewPrivileges` false unless `--security-opt no-new-privileges`;
* seccomp: docker's default profile is an allow-list of ~350 syscalls with argument filters; this
  is APPROXIMATED by a deny-list of the syscalls that profile refuses to a container without
  CAP_SYS_ADMIN (namespaces, mounts, keyrings, BPF, modules...), answering EPERM as docker does;
  `seccomp=unconfined` removes it;
* namespaces pid, ipc, uts, mount, cgroup and network, less what `--network host`/`--ipc host`
  share; "host" here is the test's own network namespace, joined by path;
* docker's masked and read-only /proc and /sys paths, its /dev, /dev/pts, /dev/shm, /dev/mqueue;
  cgroups under `--cgroup-parent` (docker's cgroupfs layout, `<parent>/<container>`).
AppArmor (dockerd's `docker-default` on Ubuntu) is not modelled.
"""

from __future__ import annotations

from typing import Any

DOCKER_DEFAULT_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
SECCOMP_REFUSED = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "userfaultfd",
    "quotactl",
    "lookup_dcookie",
    "iopl",
    "ioperm",
)
"""Syscalls docker's default seccomp profile refuses to a container without CAP_SYS_ADMIN (a subset)."""
_MASKED = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
_READ_ONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
_IGNORED = {"--name", "--stop-timeout", "--log-driver", "--log-opt"}
"""Options with a value that change nothing runc enforces (docker's own naming, stop and logging)."""


def _mounts() -> list[dict[str, Any]]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755"]},
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        },
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        },
    ]


def _bind(spec: str) -> dict[str, Any]:
    fields = dict(item.split("=", 1) for item in spec.split(","))
    if set(fields) - {"type", "src", "dst", "readonly"} or fields.get("type") != "bind":
        raise ValueError(f"--mount {spec!r}: only type=bind,src=,dst= is translated")
    options = ["rbind", "rprivate", *(["ro"] if "readonly" in fields else [])]
    return {"destination": fields["dst"], "type": "bind", "source": fields["src"], "options": options}


def _env_file(text: str) -> list[str]:
    """docker's --env-file: NAME=value per line, the value as it is; blank and # lines skipped."""
    return [line for line in text.split("\n") if line.strip() and not line.lstrip().startswith("#")]


def oci_config(
    argv: list[str],
    *,
    rootfs: str,
    netns: str,
    env_files: dict[str, str],
    client_env: dict[str, str],
    default_cgroup_parent: str,
) -> dict[str, Any]:
    """The OCI config for `argv` (`docker run ...`, without the docker binary).

    `env_files` holds each `--env-file`'s text (the runtime removes the file once the container
    ends), `client_env` the docker client's environment (where `-e NAME` reads NAME), `netns` the
    path of the network namespace `--network host` means here.
    """
    if argv[0] != "run":
        raise ValueError(f"not a docker run: {argv[:2]}")
    caps, nnp, seccomp, share = set(DOCKER_DEFAULT_CAPABILITIES), False, True, set()
    uid = gid = 0
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/"]
    mounts, pids, parent, name, readonly = _mounts(), None, default_cgroup_parent, "container", False
    i = 1
    while argv[i].startswith("-"):
        option = argv[i]
        if option in ("--rm", "--read-only"):  # the two options without a value
            readonly = readonly or option == "--read-only"
            i += 1
            continue
        value, i = argv[i + 1], i + 2
        if option == "--name":
            name = value
        elif option in _IGNORED:
            pass
        elif option in ("--network", "--ipc"):
            if value != "host":
                raise ValueError(f"{option} {value}: only host is translated")
            share.add(option.lstrip("-"))
        elif option == "--user":
            uid, gid = (int(part) for part in value.split(":"))
        elif option == "--security-opt":
            if value in ("no-new-privileges", "no-new-privileges:true"):
                nnp = True
            elif value == "seccomp=unconfined":
                seccomp = False
            else:
                raise ValueError(f"--security-opt {value}: not translated")
        elif option == "--cap-drop":
            caps = set() if value.upper() == "ALL" else caps - {"CAP_" + value.upper().removeprefix("CAP_")}
        elif option == "--cap-add":
            caps |= {"CAP_" + value.upper().removeprefix("CAP_")}
        elif option == "--pids-limit":
            pids = int(value)
        elif option == "--cgroup-parent":
            parent = value
        elif option == "--mount":
            mounts.append(_bind(value))
        elif option == "--env-file":
            env += _env_file(env_files[value])
        elif option == "-e":
            env += [f"{value}={client_env[value]}"] if value in client_env else []
        else:
            raise ValueError(f"docker run option {option} is not translated: extend docker_to_oci.py")
    command = argv[i + 1 :]  # argv[i] is the image: the rootfs stands for it
    namespaces = [{"type": kind} for kind in ("pid", "ipc", "uts", "mount", "cgroup") if kind not in share]
    namespaces.append({"type": "network", "path": netns})  # --network host: the test's "host" namespace
    capabilities: dict[str, list[str]] = {"bounding": sorted(caps)}
    if uid == 0:
        capabilities.update(effective=sorted(caps), permitted=sorted(caps))
    linux: dict[str, Any] = {
        "namespaces": namespaces,
        "cgroupsPath": f"/{parent.strip('/')}/{name}",
        "maskedPaths": list(_MASKED),
        "readonlyPaths": list(_READ_ONLY),
        "resources": {"pids": {"limit": pids}} if pids else {},
    }
    if seccomp:
        linux["seccomp"] = {  # no architectures: the host's own
            "defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": list(SECCOMP_REFUSED), "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
        }
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": command,
            "env": env,
            "cwd": "/",
            "capabilities": capabilities,
            "noNewPrivileges": nnp,
        },
        "root": {"path": rootfs, "readonly": readonly},
        "hostname": name[:63],
        "mounts": mounts,
        "linux": linux,
    }
