"""GPU metrics from the CloudWatch agent, which the idle alarms watch: installed where the AMI lacks it.

A GPU job's idle alarm reads `CWAgent / nvidia_smi_utilization_gpu {InstanceId}`, which only the
agent publishes (`AWS/EC2` has no GPU metric). The DLAMIs' package lists do not name it, so the
bootstrap installs it where `amazon-cloudwatch-agent-ctl` is missing: from the distribution's
repository with dnf (Amazon Linux 2023 carries `amazon-cloudwatch-agent`; dnf checks the
repository's signatures), else on Ubuntu and Debian the `.deb` from AWS's download bucket in the
job's region, installed only if its GPG signature verifies under the agent's published key
fingerprint. Then it starts the agent with `cloudwatch_agent_config()`.

The outcome is one line, `GpuMetrics.status`: the bootstrap logs it and the exit report carries it
(`gpu_metrics`). When the agent cannot run, training goes on, but the instance's idle alarm gets no
data, and the alarm reads missing data as not idle (docs/instance.md, "GPU metrics and idle
detection"): the bootstrap says so loudly instead of leaving idle detection off in silence.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from gpujobs.instance.log import log

CW_AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
CW_AGENT_CONFIG = "/opt/aws/amazon-cloudwatch-agent/etc/gpujobs-gpu.json"
AGENT_KEY_FINGERPRINT = "937616F3450B7D806CBD9725D58167303B789C72"
"""The agent's signing key, as AWS publishes it ("Verifying the signature of the CloudWatch agent package")."""
DEB_PLATFORMS = ("ubuntu", "debian")
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
INSTALL_TIMEOUT = 600
DPKG_LOCK_TRIES = 12
"""Ubuntu's unattended upgrades hold dpkg's lock for a while after boot: `dpkg -i` is tried again,
every 10 s, while its output says the lock is taken."""
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
UNAVAILABLE = "unavailable"
"""How `GpuMetrics.status` starts when the agent does not run."""


class AgentUnavailableError(Exception):
    """Why the agent cannot run here, in words for the log and the exit report."""


def cloudwatch_agent_config() -> dict[str, Any]:
    """NVIDIA GPU metrics every 60 s in CWAgent, plus a per-instance series for idle alarms."""
    return {
        "agent": {"metrics_collection_interval": 60, "run_as_user": "root"},
        "metrics": {
            "namespace": "CWAgent",
            "append_dimensions": {"InstanceId": "${aws:InstanceId}"},
            "aggregation_dimensions": [["InstanceId"]],
            "metrics_collected": {
                "nvidia_gpu": {
                    "measurement": ["utilization_gpu", "utilization_memory", "memory_used"],
                    "metrics_collection_interval": 60,
                }
            },
        },
    }


def download_base(region: str) -> str:
    """AWS's agent bucket in `region`: reachable through the region's S3 gateway endpoint, without NAT."""
    if not _REGION.fullmatch(region):
        raise AgentUnavailableError(f"{region!r} is not a region name")
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://amazoncloudwatch-agent-{region}.s3.{region}.{domain}"


class System:
    """What the installer touches on the host; tests give a fake one."""

    def which(self, program: str) -> str | None:
        return shutil.which(program)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def run(self, argv: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, str]:
        """Exit code and output (stdout then stderr) of `argv`; never a shell."""
        try:
            done = subprocess.run(list(argv), capture_output=True, timeout=INSTALL_TIMEOUT, env=env, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return 127, str(exc)
        return done.returncode, (done.stdout + done.stderr).decode(errors="replace")

    def fetch(self, url: str, path: str) -> None:
        """`url` (HTTPS) saved at `path`; raises OSError (urllib's errors are OSErrors) on failure."""
        with urllib.request.urlopen(url, timeout=120) as response, open(path, "wb") as out:  # noqa: S310 (https only)
            shutil.copyfileobj(response, out)

    def write(self, path: str, text: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def os_release_id(self) -> str:
        try:
            with open("/etc/os-release", encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError:
            return ""
        found = [line.partition("=")[2] for line in lines if line.startswith("ID=")]
        return found[0].strip("\"'") if found else ""

    def machine(self) -> str:
        return platform.machine()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _tail(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][-200:] if lines else "no output"


def _install_with_dnf(system: System) -> str:
    code, output = system.run(["dnf", "install", "-y", "amazon-cloudwatch-agent"])
    if code != 0:
        raise AgentUnavailableError(f"dnf install amazon-cloudwatch-agent failed ({code}): {_tail(output)}")
    return "installed with dnf"


def _install_deb(system: System, region: str, distro: str) -> str:
    arch = ARCHES.get(system.machine())
    if arch is None:
        raise AgentUnavailableError(f"no agent package for {system.machine()}")
    if not system.which("gpg"):
        raise AgentUnavailableError("gpg is missing: the agent's .deb cannot be verified, so it is not installed")
    url = f"{download_base(region)}/{distro}/{arch}/latest/amazon-cloudwatch-agent.deb"
    with tempfile.TemporaryDirectory(prefix="gpujobs-cwagent-") as folder:
        deb, sig, key = (os.path.join(folder, name) for name in ("agent.deb", "agent.deb.sig", "agent.gpg"))
        try:
            system.fetch(url, deb)
            system.fetch(url + ".sig", sig)
            system.fetch(f"{download_base(region)}/assets/amazon-cloudwatch-agent.gpg", key)
        except OSError as exc:
            raise AgentUnavailableError(f"cannot download {url}: {exc}") from exc
        env = {"GNUPGHOME": os.path.join(folder, "gnupg"), "PATH": os.environ.get("PATH", os.defpath)}
        try:
            _verify(system, env, key=key, sig=sig, deb=deb)
        finally:  # gpg starts an agent for its keyring; it must not outlive the keyring
            system.run(["gpgconf", "--kill", "all"], env=env)
        for _ in range(DPKG_LOCK_TRIES):
            code, output = system.run(["dpkg", "-i", "-E", deb])
            if code == 0 or "lock" not in output:
                break
            system.sleep(10)
        if code != 0:
            raise AgentUnavailableError(f"dpkg -i amazon-cloudwatch-agent.deb failed ({code}): {_tail(output)}")
    return f"installed from {url}"


def _verify(system: System, env: dict[str, str], *, key: str, sig: str, deb: str) -> None:
    """The .deb is signed by the agent's key, whose fingerprint is pinned here (not taken from the download)."""
    os.makedirs(env["GNUPGHOME"], mode=0o700, exist_ok=True)
    code, output = system.run(["gpg", "--batch", "--import", key], env=env)
    if code != 0:
        raise AgentUnavailableError(f"gpg cannot import the agent's key: {_tail(output)}")
    code, output = system.run(["gpg", "--batch", "--status-fd", "1", "--verify", sig, deb], env=env)
    signers = {
        fingerprint
        for line in output.splitlines()
        if line.startswith("[GNUPG:] VALIDSIG ")
        for fingerprint in (line.split()[2], line.split()[-1])
    }
    if code != 0 or AGENT_KEY_FINGERPRINT not in signers:
        raise AgentUnavailableError(f"the agent's .deb is not signed by key {AGENT_KEY_FINGERPRINT}: refused")


def install_agent(system: System, region: str) -> str:
    """Install the agent where it is missing; how it was installed, or AgentUnavailableError."""
    if system.which("dnf"):
        how = _install_with_dnf(system)
    elif system.which("dpkg"):
        distro = system.os_release_id()
        if distro not in DEB_PLATFORMS:
            raise AgentUnavailableError(f"no agent package for this distribution ({distro or 'unknown'})")
        how = _install_deb(system, region, distro)
    else:
        raise AgentUnavailableError("not installed, and neither dnf nor dpkg is here to install it")
    if not system.exists(CW_AGENT_CTL):
        raise AgentUnavailableError(f"{how}, but {CW_AGENT_CTL} is missing")
    return how


def start_agent(system: System, region: str) -> str:
    """Install the agent if missing, then start it with the GPU config: what happened, or AgentUnavailableError."""
    how = "found on the AMI" if system.exists(CW_AGENT_CTL) else install_agent(system, region)
    try:
        system.write(CW_AGENT_CONFIG, json.dumps(cloudwatch_agent_config()))
    except OSError as exc:
        raise AgentUnavailableError(f"cannot write {CW_AGENT_CONFIG}: {exc}") from exc
    argv = [CW_AGENT_CTL, "-a", "fetch-config", "-m", "ec2", "-s", "-c", "file:" + CW_AGENT_CONFIG]
    code, output = system.run(argv)
    if code != 0:
        raise AgentUnavailableError(f"agent {how}, but it did not start ({code}): {_tail(output)}")
    return f"CloudWatch agent {how}, started: CWAgent nvidia_smi_utilization_gpu by InstanceId"


class GpuMetrics:
    """The agent started in the background (an install must not hold up the image pull)."""

    def __init__(self, region: str, *, system: System | None = None, notify: Callable[[str], None] = log) -> None:
        self.status = "pending: the CloudWatch agent is being set up"
        self._region, self._system, self._notify = region, system or System(), notify
        self._thread = threading.Thread(target=self._run, name="gpujobs-cwagent", daemon=True)

    def start(self) -> GpuMetrics:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.status = start_agent(self._system, self._region)
            self._notify(self.status)
        except Exception as exc:  # whatever it was, idle detection is off and must say so
            why = str(exc) if isinstance(exc, AgentUnavailableError) else f"{type(exc).__name__}: {exc}"
            self.status = f"{UNAVAILABLE}: {why}"
            self._notify(
                f"IDLE DETECTION IS OFF for this instance: the CloudWatch agent is {self.status}. No GPU "
                "metric reaches its idle alarm, which reads missing data as not idle: idle GPUs here are never stopped"
            )

    def result(self, timeout: float) -> str:
        """The status once the setup ended, or `pending` after `timeout` seconds."""
        self._thread.join(timeout)
        return self.status
