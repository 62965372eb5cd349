"""A setuid-root binary in the job's own image reads the instance role from IMDS: proved with runc.

The attack (issue 18): the job's image carries a setuid-root copy of a binary that asks IMDS for
the instance role's credentials (IMDSv2, IPv4 and IPv6). Before this change the container had
docker's default capabilities and no `no-new-privileges`, and the only IMDS block was an `owner`
rule for uid 10001: the binary became euid 0, which the rule does not match, and IPv6 had no rule.

How it is played, with a real container runtime and real netfilter:
* a rootfs built here: `confinement/probe.c`, compiled static, as /bin/probe and as a setuid-root
  /bin/probe-suid (the attacker's helper);
* two private network namespaces joined by a veth pair: the "host" (where the container runs with
  `--network host`, the bootstrap's rules are installed and the bootstrap's real `HostAgent` serves
  on loopback) and the "hypervisor", where a fake IMDS answers on 169.254.169.254:80 and
  [fd00:ec2::254]:80 (`confinement/netns_services.py`);
* the bootstrap's real `DockerRuntime` builds its `docker run` argv (a fake docker records it) and
  installs its real IMDS rules in the host namespace (`block_imds`, iptables and ip6tables through
  `ip netns exec`); `confinement/docker_to_oci.py` turns that argv into the OCI spec dockerd would
  give runc, and runc runs it. Today's argv and rule are replayed the same way.

| privileges (argv) | IMDS rule | the setuid binary runs as | IPv4 IMDS | IPv6 IMDS |
|---|---|---|---|---|
| today's | today's (uid owner, IPv4) | euid 0 | credentials | credentials |
| today's | the bootstrap's (cgroup, both) | euid 0 | refused | refused |
| the bootstrap's | today's | uid 10001 | refused | credentials |
| the bootstrap's | the bootstrap's | uid 10001, no capability | refused | refused |

What this does not prove: docker's own translation of these options (dockerd is not here; the
translation follows moby's defaults, docker_to_oci.py), docker's real seccomp profile (a deny-list
subset stands for it), AppArmor, the systemd cgroup driver (cgroupfs is played; the slice is
covered on fakes in tests/unit/test_instance_isolation.py), or EC2's real IMDS and hop limit.
Skipped, naming what is missing, without root, runc, ip/iptables/ip6tables, a static gcc,
a cgroup v2 hierarchy, network namespaces or iptables' cgroup match.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpujobs.instance import confinement, runtimes
from tests.integration.confinement.docker_to_oci import oci_config
from tests.integration.confinement.netns_services import INSTANCE_ROLE_KEY, JOB_KEY, SPOT_NOTICE

HERE = Path(__file__).parent / "confinement"
SERVICES = HERE / "netns_services.py"

pytestmark = pytest.mark.slow
TODAYS_RULE = ["OUTPUT", "-d", "169.254.169.254", "-m", "owner", "--uid-owner", "10001", "-j", "REJECT"]
"""`DockerRuntime.block_imds(10001)` before this change (commit 180a797): the only IMDS rule."""
REFUSED = "token: error: connect: Connection refused"
"""What the probe reports when a REJECT answers its token PUT."""
_serial = itertools.count()


def todays_docker_run(doc: dict[str, Any], env: dict[str, str], env_file: str, mounts: list[str]) -> list[str]:
    """The argv `DockerRuntime.start` built before this change (commit 180a797), after
    `block_imds(10001)`: env names on argv, their values from the docker client's environment."""
    argv = ["run", "--rm", "--name", runtimes.container_name(doc["job_id"], doc["attempt"])]
    argv += ["--network", "host", "--ipc", "host", "--stop-timeout", str(doc["stop_timeout_seconds"])]
    argv += ["--user", "10001:10001"]
    for mount in mounts:
        argv += ["--mount", mount]
    argv += ["--env-file", env_file]
    for key in sorted(env):
        argv += ["-e", key]
    return [*argv, doc["image"], *doc["command"]]


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)


def _why_not(scratch: Path) -> str | None:
    """Why this machine cannot play the attack, or None."""
    if os.geteuid() != 0:
        return "needs root (runc, network namespaces and iptables)"
    missing = [tool for tool in ("runc", "ip", "iptables", "ip6tables", "gcc") if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH"
    built = _run("gcc", "-static", "-O2", "-o", str(scratch / "probe"), str(HERE / "probe.c"), check=False)
    if built.returncode != 0:
        return f"gcc cannot build a static binary (static libc, e.g. libc6-dev, missing?): {built.stderr[-200:]}"
    try:
        confinement.cgroup2_root()
    except Exception as exc:
        return str(exc)
    name = f"gjc-probe-{os.getpid()}"
    made = _run("ip", "netns", "add", name, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        rule = ["-A", "OUTPUT", "-m", "cgroup", "--path", "/", "-j", "ACCEPT"]
        for tool in ("iptables", "ip6tables"):
            done = _run("ip", "netns", "exec", name, tool, *rule, check=False)
            if done.returncode != 0:
                return f"{tool} has no cgroup match here: {done.stderr.strip()[-200:]}"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return None


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The job's image: the probe, plain and setuid root (built once)."""
    scratch = tmp_path_factory.mktemp("probe")
    reason = _why_not(scratch)
    if reason:
        pytest.skip(reason)
    root = scratch / "rootfs"
    for folder in ("bin", "proc", "dev", "sys", "tmp", "etc"):
        (root / folder).mkdir(parents=True)
    shutil.copy(scratch / "probe", root / "bin" / "probe")
    shutil.copy(scratch / "probe", root / "bin" / "probe-suid")
    os.chown(root / "bin" / "probe-suid", 0, 0)
    os.chmod(root / "bin" / "probe-suid", 0o4755)
    return str(root)


class Host:
    """The instance: a "host" network namespace with the host agent, a "hypervisor" one with IMDS."""

    def __init__(self, tmp_path: Path, rootfs: str) -> None:
        n = f"{os.getpid() % 100000}{next(_serial)}"
        self.tmp, self.rootfs, self.ns, imds_ns = tmp_path, rootfs, f"gjc-{n}-host", f"gjc-{n}-imds"
        self.cgroup_name = f"gpujobs-test-{n}"
        self.default_parent = f"gpujobs-test-docker-{n}"
        self.services: list[subprocess.Popen[str]] = []
        self.namespaces = [self.ns, imds_ns]
        for name in self.namespaces:
            _run("ip", "netns", "add", name)
        veth = f"gjc{n}"[:13]
        _run(
            "ip",
            "link",
            "add",
            veth + "h",
            "netns",
            self.ns,
            "type",
            "veth",
            "peer",
            "name",
            veth + "i",
            "netns",
            imds_ns,
        )
        for name, link, v4, v6 in (
            (self.ns, veth + "h", "169.254.0.1/16", "fd00:ec2::1/64"),
            (imds_ns, veth + "i", "169.254.169.254/16", "fd00:ec2::254/64"),
        ):
            _run("ip", "-n", name, "link", "set", "lo", "up")
            _run("ip", "-n", name, "addr", "add", v4, "dev", link)
            _run("ip", "-n", name, "-6", "addr", "add", v6, "dev", link, "nodad")  # usable at once
            _run("ip", "-n", name, "link", "set", link, "up")
        self._serve(imds_ns, "imds")
        agent = self._serve(self.ns, "agent")
        self.agent_env, self.agent_private = agent["public"], agent["private"]
        self.tools = {tool: self._in_host(tool) for tool in ("iptables", "ip6tables")}

    def _serve(self, namespace: str, what: str) -> dict[str, Any]:
        argv = ["ip", "netns", "exec", namespace, sys.executable, str(SERVICES), what]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.services.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it serves: no sleeping
        assert line, f"{what} did not start: {proc.stderr.read() if proc.stderr else ''}"
        ready: dict[str, Any] = json.loads(line)
        return ready

    def _in_host(self, tool: str) -> str:
        """`tool` as the bootstrap calls it, run inside the host namespace."""
        path = self.tmp / "bin" / tool
        path.parent.mkdir(exist_ok=True)
        path.write_text(
            f"#!{sys.executable}\nimport os, sys\nos.execvp('ip', ['ip', 'netns', 'exec', {self.ns!r}, {tool!r}, *sys.argv[1:]])\n"
        )
        path.chmod(0o755)
        return str(path)

    def install_todays_rule(self) -> None:
        _run(self.tools["iptables"], "-I", *TODAYS_RULE)

    def run(self, argv: list[str], *, env_files: dict[str, str], client_env: dict[str, str]) -> dict[str, Any]:
        """Run `docker run` argv's container with runc; what the probe saw."""
        bundle = self.tmp / f"bundle-{next(_serial)}"
        bundle.mkdir()
        config = oci_config(
            argv,
            rootfs=self.rootfs,
            netns=f"/run/netns/{self.ns}",
            env_files=env_files,
            client_env=client_env,
            default_cgroup_parent=self.default_parent,
        )
        (bundle / "config.json").write_text(json.dumps(config))
        state = str(self.tmp / "runc")
        done = _run("runc", "--root", state, "run", "--bundle", str(bundle), f"gjc-{bundle.name}", check=False)
        assert done.returncode == 0, done.stderr
        seen: dict[str, Any] = json.loads(done.stdout)
        return seen

    def close(self) -> None:
        for proc in self.services:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=30)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
        for name in self.namespaces:  # takes the veth pair and every rule with it
            _run("ip", "netns", "del", name, check=False)
        for parent in (self.cgroup_name, self.default_parent):  # runc removes the container's own
            for folder in glob.glob(f"/sys/fs/cgroup/{parent}") + glob.glob(f"/sys/fs/cgroup/*/{parent}"):
                for child in sorted(Path(folder).glob("**/"), key=lambda p: -len(p.parts)):
                    child.rmdir()


@pytest.fixture
def host(tmp_path: Path, rootfs: str) -> Iterator[Host]:
    made = Host(tmp_path, rootfs)
    try:
        yield made
    finally:
        made.close()


DOC = {
    "job_id": "job-7",
    "attempt": 3,
    "gpus_per_node": 0,
    "stop_timeout_seconds": 9,
    "image": "gpujobs-test/probe",
    "command": ["/bin/probe-suid"],
}
FAKE_DOCKER = """import json, os, sys
argv = sys.argv[1:]
if argv[0] == "info":  # what the DLAMI's docker reports, with the cgroupfs driver (no systemd here)
    print('cgroupfs 2 ["name=apparmor","name=seccomp,profile=builtin","name=cgroupns"]')
    sys.exit(0)
env_file = argv[argv.index("--env-file") + 1]
with open(os.environ["FAKE_DOCKER_LOG"], "w") as log:
    json.dump({"argv": argv, "env_file": env_file, "text": open(env_file).read()}, log)
"""


def the_bootstraps_docker_run(
    host: Host, monkeypatch: pytest.MonkeyPatch, *, block: bool = True
) -> tuple[list[str], dict[str, str], list[str]]:
    """(argv, env files, mounts) of the bootstrap's real `DockerRuntime`, with its IMDS rules installed."""
    docker = host.tmp / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(0o755)
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(host.tmp / "docker.json"))
    monkeypatch.setattr(runtimes, "HOST_DATA_DIR", str(host.tmp / "var-lib-gpujobs"))
    runtime = runtimes.DockerRuntime(str(docker))
    if block:
        runtime.block_imds(**host.tools, cgroup_name=host.cgroup_name, ipv6=True)
    _, output_dir = runtime.outputs_folder()
    env = {**host.agent_env, "GPUJOBS_OUTPUT_DIR": output_dir}
    env["GPUJOBS_LOCAL_CHECKPOINT_DIR"] = runtime.staging_folder(None)
    runtime.start(DOC, env, host.agent_private)
    assert runtime.wait() == 0
    recorded = json.loads((host.tmp / "docker.json").read_text())
    return recorded["argv"], {recorded["env_file"]: recorded["text"]}, runtime.mounts


def todays(host: Host, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Today's argv over the same folders and agent, and the docker client's environment it read."""
    _, _, mounts = the_bootstraps_docker_run(host, monkeypatch, block=False)
    env = {**host.agent_env, "GPUJOBS_OUTPUT_DIR": runtimes.OUTPUTS_IN_CONTAINER}
    env["GPUJOBS_LOCAL_CHECKPOINT_DIR"] = runtimes.CHECKPOINTS_IN_CONTAINER
    private = "".join(f"{k}={v}\n" for k, v in host.agent_private.items())
    return todays_docker_run(DOC, env, "/env", mounts), {"/env": private}, {**os.environ, **env}


def without_the_new_privilege_options(argv: list[str]) -> list[str]:
    """The bootstrap's argv less no-new-privileges, --cap-drop and --pids-limit: today's privileges."""
    dropped = {
        ("--security-opt", "no-new-privileges"),
        ("--cap-drop", "ALL"),
        ("--pids-limit", str(confinement.PIDS_LIMIT)),
    }
    out, i = [], 0
    while i < len(argv):
        if (argv[i], argv[i + 1] if i + 1 < len(argv) else "") in dropped:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def assert_the_host_agent_still_serves(seen: dict[str, Any]) -> None:
    assert seen["agent_credentials"].startswith("200 ")
    assert json.loads(seen["agent_credentials"][4:])["AccessKeyId"] == JOB_KEY
    assert json.loads(seen["agent_spot"][4:]) == SPOT_NOTICE  # relayed from IMDS by the agent, outside the group


def test_todays_container_lets_a_setuid_binary_read_the_instance_role_over_ipv4_and_ipv6(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, env_files, client_env = todays(host, monkeypatch)
    host.install_todays_rule()

    seen = host.run(argv, env_files=env_files, client_env=client_env)

    assert (seen["uid"], seen["euid"]) == (10001, 0)
    assert seen["cap_eff"] != "0000000000000000"
    assert INSTANCE_ROLE_KEY in seen["imds_ipv4"]
    assert INSTANCE_ROLE_KEY in seen["imds_ipv6"]
    assert seen["unshare_user"] == "Operation not permitted"  # docker's seccomp (approximated) was on


def test_the_bootstraps_container_and_rules_refuse_imds_and_keep_the_host_agent(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, env_files, _ = the_bootstraps_docker_run(host, monkeypatch)

    seen = host.run(argv, env_files=env_files, client_env={})

    assert (seen["uid"], seen["euid"]) == (10001, 10001)  # no-new-privileges: setuid gains nothing
    assert seen["cap_eff"] == "0000000000000000"
    assert seen["imds_ipv4"] == REFUSED
    assert seen["imds_ipv6"] == REFUSED
    assert INSTANCE_ROLE_KEY not in json.dumps(seen)
    assert_the_host_agent_still_serves(seen)
    assert (seen["write_outputs"], seen["write_checkpoints"]) == ("ok", "ok")  # training still writes its folders
    assert seen["unshare_user"] == "Operation not permitted"


def test_the_cgroup_rule_alone_refuses_imds_to_a_container_process_that_became_root(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, env_files, _ = the_bootstraps_docker_run(host, monkeypatch)

    seen = host.run(without_the_new_privilege_options(argv), env_files=env_files, client_env={})

    assert seen["euid"] == 0
    assert seen["imds_ipv4"] == REFUSED
    assert seen["imds_ipv6"] == REFUSED
    assert_the_host_agent_still_serves(seen)


def test_no_new_privileges_alone_keeps_the_uid_but_todays_rule_leaves_ipv6_open(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, env_files, _ = the_bootstraps_docker_run(host, monkeypatch, block=False)
    host.install_todays_rule()

    seen = host.run(argv, env_files=env_files, client_env={})

    assert seen["euid"] == 10001
    assert seen["imds_ipv4"] == REFUSED
    assert INSTANCE_ROLE_KEY in seen["imds_ipv6"]
