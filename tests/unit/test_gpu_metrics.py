"""Idle detection's metric: the bootstrap installs and starts the CloudWatch agent, or says loudly it cannot.

A GPU job's idle alarm watches `CWAgent nvidia_smi_utilization_gpu {InstanceId}`, which only the
agent publishes. Stories: an AMI with the agent starts it; Amazon Linux 2023 without it installs it
with dnf; Ubuntu installs AWS's .deb only when its signature verifies under the pinned key (real
gpg, a key made here standing in for AWS's); every way it can fail ends in one `unavailable: ...`
status and an IDLE DETECTION IS OFF line, and never stops the job.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpujobs.instance import cloudwatch_agent
from gpujobs.instance.cloudwatch_agent import CW_AGENT_CONFIG, CW_AGENT_CTL, GpuMetrics, System

REGION = "eu-central-1"
BASE = "https://amazoncloudwatch-agent-eu-central-1.s3.eu-central-1.amazonaws.com"


class FakeHost(System):
    """A host whose programs answer as told, recording every call; files live in a dict."""

    def __init__(
        self,
        *,
        programs: Sequence[str] = (),
        agent: bool = False,
        distro: str = "amzn",
        answers: dict[str, Any] | None = None,
        downloads: dict[str, bytes] | None = None,
    ) -> None:
        self.programs = set(programs)
        self.files: dict[str, str] = {CW_AGENT_CTL: ""} if agent else {}
        self.distro = distro
        self.answers = answers or {}
        self.downloads = downloads or {}
        self.calls: list[list[str]] = []
        self.fetched: list[str] = []
        self.slept: list[float] = []

    def which(self, program: str) -> str | None:
        return f"/usr/bin/{program}" if program in self.programs else None

    def exists(self, path: str) -> bool:
        return path in self.files

    def run(self, argv: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, str]:
        self.calls.append(list(argv))
        answer = self.answers.get(Path(argv[0]).name, (0, ""))
        code, output = answer.pop(0) if isinstance(answer, list) else answer
        if code == 0 and argv[0] in ("dnf", "dpkg"):
            self.files[CW_AGENT_CTL] = ""  # the package puts the agent in place
        return code, output

    def fetch(self, url: str, path: str) -> None:
        self.fetched.append(url)
        if url not in self.downloads:
            raise OSError(f"<urlopen error [Errno 110] Connection timed out> {url}")
        Path(path).write_bytes(self.downloads[url])

    def write(self, path: str, text: str) -> None:
        self.files[path] = text

    def os_release_id(self) -> str:
        return self.distro

    def machine(self) -> str:
        return "x86_64"

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def set_up(host: System) -> tuple[str, list[str]]:
    said: list[str] = []
    status = GpuMetrics(REGION, system=host, notify=said.append).start().result(timeout=30)
    return status, said


START = [CW_AGENT_CTL, "-a", "fetch-config", "-m", "ec2", "-s", "-c", "file:" + CW_AGENT_CONFIG]


def test_an_ami_with_the_agent_starts_it_with_the_per_instance_gpu_series() -> None:
    host = FakeHost(agent=True, programs=["dnf"])

    status, said = set_up(host)

    assert status.startswith("CloudWatch agent found on the AMI, started")
    assert host.calls == [START]  # nothing installed
    assert json.loads(host.files[CW_AGENT_CONFIG]) == cloudwatch_agent.cloudwatch_agent_config()
    assert said == [status]


def test_amazon_linux_without_the_agent_installs_it_from_its_repository_with_dnf() -> None:
    host = FakeHost(programs=["dnf", "rpm"])

    status, _ = set_up(host)

    assert host.calls == [["dnf", "install", "-y", "amazon-cloudwatch-agent"], START]
    assert status.startswith("CloudWatch agent installed with dnf, started")


def test_an_agent_that_cannot_be_installed_turns_idle_detection_off_loudly() -> None:
    host = FakeHost(programs=["dnf"], answers={"dnf": (1, "Error: Failed to download metadata for repo 'amazonlinux'")})

    status, said = set_up(host)

    assert status == (
        "unavailable: dnf install amazon-cloudwatch-agent failed (1): "
        "Error: Failed to download metadata for repo 'amazonlinux'"
    )
    assert START not in host.calls
    [line] = said
    assert line.startswith(f"IDLE DETECTION IS OFF for this instance: the CloudWatch agent is {status}.")
    assert "idle GPUs here are never stopped" in line


@pytest.mark.parametrize(
    ("host", "why"),
    [
        (FakeHost(programs=[]), "unavailable: not installed, and neither dnf nor dpkg is here to install it"),
        (FakeHost(programs=["dpkg", "gpg"], distro="sles"), "unavailable: no agent package for this distribution"),
        (FakeHost(programs=["dpkg"], distro="ubuntu"), "unavailable: gpg is missing"),
        (FakeHost(programs=["dpkg", "gpg"], distro="ubuntu"), f"unavailable: cannot download {BASE}/ubuntu/amd64/"),
        (
            FakeHost(agent=True, answers={"amazon-cloudwatch-agent-ctl": (1, "E! nvidia-smi not found")}),
            "unavailable: agent found on the AMI, but it did not start (1): E! nvidia-smi not found",
        ),
    ],
    ids=["no-package-manager", "unknown-distribution", "no-gpg", "no-route-to-the-bucket", "agent-fails-to-start"],
)
def test_every_way_the_agent_cannot_run_is_one_unavailable_status(host: FakeHost, why: str) -> None:
    status, said = set_up(host)

    assert status.startswith(why)
    assert said[-1].startswith("IDLE DETECTION IS OFF")


def test_a_region_that_is_not_a_region_name_never_reaches_a_url() -> None:
    host = FakeHost(programs=["dpkg", "gpg"], distro="ubuntu")
    said: list[str] = []

    status = GpuMetrics("x.example.com#", system=host, notify=said.append).start().result(timeout=30)

    assert status == "unavailable: 'x.example.com#' is not a region name"
    assert host.fetched == []


# ---- Ubuntu: the .deb runs as root only if AWS's key signed it (real gpg) -----------------------------
def gpg(home: Path, *args: str) -> str:
    done = subprocess.run(["gpg", "--batch", "--homedir", str(home), *args], capture_output=True, check=True)
    return done.stdout.decode()


def a_signing_key(home: Path, name: str) -> tuple[str, bytes]:
    """A fresh key (fingerprint, exported public key), standing in for the agent's."""
    home.mkdir(mode=0o700)
    gpg(home, "--passphrase", "", "--quick-gen-key", name, "rsa2048", "sign", "never")
    fingerprint = next(
        line.split(":")[9]
        for line in gpg(home, "--with-colons", "--fingerprint").splitlines()
        if line.startswith("fpr")
    )
    return fingerprint, gpg(home, "--armor", "--export").encode()


class UbuntuHost(FakeHost):
    """Downloads and dpkg are fake; gpg (and gpgconf, which stops its agent) are the real ones."""

    def run(self, argv: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, str]:
        if argv[0] in ("gpg", "gpgconf"):
            self.calls.append(list(argv))
            return System.run(self, argv, env)
        return super().run(argv, env)


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A package signed by "AWS's" key, and the same bytes signed by another key."""
    if not shutil.which("gpg"):
        pytest.skip("no gpg")
    root = tmp_path_factory.mktemp("keys")
    yield a_signed_package(root)
    for owner in ("aws", "other"):  # the agents gpg started for these keyrings
        subprocess.run(["gpgconf", "--homedir", str(root / owner), "--kill", "all"], check=False)


def a_signed_package(root: Path) -> dict[str, Any]:
    deb = root / "agent.deb"
    deb.write_bytes(b"!<arch>\nnot really a package\n")
    aws_fpr, aws_key = a_signing_key(root / "aws", "Amazon CloudWatch Agent (test)")
    _, other_key = a_signing_key(root / "other", "someone else")
    signatures = {}
    for owner in ("aws", "other"):
        sig = root / f"{owner}.sig"
        gpg(root / owner, "--output", str(sig), "--detach-sign", str(deb))
        signatures[owner] = sig.read_bytes()
    return {"deb": deb.read_bytes(), "fpr": aws_fpr, "aws_key": aws_key, "other_key": other_key, **signatures}


def ubuntu_host(deb: bytes, sig: bytes, key: bytes) -> UbuntuHost:
    url = f"{BASE}/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb"
    downloads = {url: deb, url + ".sig": sig, f"{BASE}/assets/amazon-cloudwatch-agent.gpg": key}
    return UbuntuHost(programs=["dpkg", "gpg", "apt-get"], distro="ubuntu", downloads=downloads)


def test_ubuntu_installs_the_deb_from_the_regional_bucket_once_its_signature_verifies(
    signed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cloudwatch_agent, "AGENT_KEY_FINGERPRINT", signed["fpr"])
    host = ubuntu_host(signed["deb"], signed["aws"], signed["aws_key"])

    status, _ = set_up(host)

    assert status.startswith(f"CloudWatch agent installed from {BASE}/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb")
    assert [call[:3] for call in host.calls if call[0] == "dpkg"] == [["dpkg", "-i", "-E"]]
    assert host.calls[-1] == START


@pytest.mark.parametrize(
    ("sig", "key", "deb"),
    [("other", "other_key", "deb"), ("aws", "aws_key", "tampered")],
    ids=["signed-by-another-key-served-beside-it", "bytes-changed-after-signing"],
)
def test_ubuntu_refuses_a_deb_the_pinned_key_did_not_sign(
    signed: dict[str, Any], monkeypatch: pytest.MonkeyPatch, sig: str, key: str, deb: str
) -> None:
    monkeypatch.setattr(cloudwatch_agent, "AGENT_KEY_FINGERPRINT", signed["fpr"])
    package = signed["deb"] + b"evil" if deb == "tampered" else signed["deb"]
    host = ubuntu_host(package, signed[sig], signed[key])

    status, said = set_up(host)

    assert status == f"unavailable: the agent's .deb is not signed by key {signed['fpr']}: refused"
    assert not [call for call in host.calls if call[0] == "dpkg"]
    assert said[-1].startswith("IDLE DETECTION IS OFF")


def test_ubuntu_waits_out_the_dpkg_lock_unattended_upgrades_hold_after_boot(
    signed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cloudwatch_agent, "AGENT_KEY_FINGERPRINT", signed["fpr"])
    host = ubuntu_host(signed["deb"], signed["aws"], signed["aws_key"])
    locked = (2, "dpkg: error: dpkg frontend lock was locked by another process with pid 812")
    host.answers["dpkg"] = [locked, locked, (0, "Setting up amazon-cloudwatch-agent")]

    status, _ = set_up(host)

    assert status.startswith("CloudWatch agent installed from")
    assert len([call for call in host.calls if call[0] == "dpkg"]) == 3
    assert host.slept == [10, 10]


def test_an_unexpected_failure_still_ends_in_one_unavailable_status() -> None:
    class Broken(FakeHost):
        def write(self, path: str, text: str) -> None:
            raise UnicodeError("surprise")

    status, said = set_up(Broken(agent=True))

    assert status == "unavailable: UnicodeError: surprise"
    assert said[-1].startswith("IDLE DETECTION IS OFF")
