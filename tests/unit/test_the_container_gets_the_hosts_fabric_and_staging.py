"""The bootstrap gives the container this host's fabric and fast storage, and names the primary interface.

Stories: NCCL and gloo are told the interface that holds the instance's private IP, never docker0
or an EFA card's; a spec that names its own interface keeps it. On a type launched with EFA the
container gets every `/dev/infiniband/uverbsN` and an unlimited memlock; on any other it gets
neither. Checkpoints stage on the mounted instance store when the type has one, else on the root
volume, mounted at the image's GPUJOBS_LOCAL_CHECKPOINT_DIR.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpujobs.instance import runtimes
from gpujobs.instance.contract import INTERCONNECT_FLOOR_ENV
from gpujobs.instance.hardware import efa_devices, interface_addresses, interface_holding, staging_base
from gpujobs.instance.node_outcome import interconnect_floor
from gpujobs.instance.workload_env import container_env

P5 = "p5.48xlarge"
DOC: dict[str, Any] = {
    "job_id": "job-7",
    "attempt": 2,
    "nodes": 2,
    "gpus_per_node": 8,
    "env": {},
    "master_port": 29500,
    "checkpoint_uri": "s3://b/jobs/job-7/ckpt",
    "checkpoint_every_minutes": 30,
    "checkpoint_mode": "gpujobs",
    "event_bus": "bus",
    "report_key": "",
    "code_uri": "",
    "resume_from_step": None,
    "stop_timeout_seconds": 120,
    "image": "train:1",
    "command": ["python", "train.py"],
    "efa_instance_types": [P5],
    "instance_store_types": [P5],
    "trainer_env": {},
    "setup": [],
    "requirements": "",
    "venv_cache_uri": "",
}
P5_HOST = {"lo": "127.0.0.1", "docker0": "172.17.0.1", "enp71s0": "10.0.3.17", "enp72s0": "10.0.3.18"}


def an_env(**options: Any) -> dict[str, str]:
    return container_env(DOC, rank=1, master_addr="10.0.3.9", instance_id="i-1", region="us-east-1", **options)


def test_the_interface_holding_the_private_ip_is_the_one_named_not_docker0() -> None:
    assert interface_holding("10.0.3.17", P5_HOST) == "enp71s0"
    assert interface_holding("10.9.9.9", P5_HOST) is None


def test_this_hosts_loopback_is_found_by_its_address() -> None:
    addresses = interface_addresses()

    assert interface_holding("127.0.0.1", addresses) == "lo"


def test_nccl_and_gloo_are_told_the_primary_interface() -> None:
    env = an_env(socket_interface="enp71s0")

    assert env["NCCL_SOCKET_IFNAME"] == "enp71s0"
    assert env["GLOO_SOCKET_IFNAME"] == "enp71s0"


def test_a_spec_naming_its_own_interface_keeps_it_and_an_unknown_one_names_none() -> None:
    own = container_env(
        {**DOC, "env": {"NCCL_SOCKET_IFNAME": "^lo,docker"}},
        rank=0,
        master_addr="10.0.3.9",
        instance_id="i-1",
        region="us-east-1",
        socket_interface="enp71s0",
    )

    assert own["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    assert own["GLOO_SOCKET_IFNAME"] == "enp71s0"
    assert "GLOO_SOCKET_IFNAME" not in an_env(socket_interface=None)


def test_the_staging_folder_reaches_the_workload_as_its_local_checkpoint_dir() -> None:
    assert an_env(staging_dir="/var/lib/gpujobs/checkpoints")["GPUJOBS_LOCAL_CHECKPOINT_DIR"] == (
        "/var/lib/gpujobs/checkpoints"
    )
    assert "GPUJOBS_LOCAL_CHECKPOINT_DIR" not in an_env()  # the process runtime keeps the workload's own


def test_efa_devices_are_passed_only_on_a_type_launched_with_efa(tmp_path: Path) -> None:
    for n in (1, 0, 3, 2):
        (tmp_path / f"uverbs{n}").touch()
    pattern = str(tmp_path / "uverbs*")

    assert efa_devices(DOC, P5, pattern) == [str(tmp_path / f"uverbs{n}") for n in range(4)]
    assert efa_devices(DOC, "g5.xlarge", pattern) == []


def test_checkpoints_stage_on_the_instance_store_only_when_the_type_has_one_and_it_is_mounted(tmp_path: Path) -> None:
    assert staging_base(DOC, P5, mount="/") == "/"
    assert staging_base(DOC, P5, mount=str(tmp_path)) is None  # not mounted (a non-DLAMI AMI): the root volume
    assert staging_base(DOC, "g5.xlarge", mount="/") is None


FAKE_DOCKER = """import json, os, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(argv + [open(argv[argv.index("--env-file") + 1]).read()]) + "\\n")
"""


def a_docker_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, devices: list[str]) -> list[str]:
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(0o755)
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setattr(runtimes, "HOST_DATA_DIR", str(tmp_path / "data"))
    owners: list[tuple[str, int, int]] = []
    monkeypatch.setattr(runtimes.os, "chown", lambda path, uid, gid: owners.append((path, uid, gid)))
    runtime = runtimes.DockerRuntime(str(docker))
    staging = runtime.staging_folder(None)
    runtime.use_efa(devices)
    runtime.start(DOC, an_env(staging_dir=staging))
    assert runtime.wait() == 0
    (folder, uid, _gid) = owners[0]
    assert Path(folder).parent == tmp_path / "data"
    assert uid == 10001
    (argv,) = (json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines())
    return list(argv)  # the last item: what the container's env file held


def test_docker_run_on_an_efa_host_gets_each_device_and_an_unlimited_memlock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    devices = [f"/dev/infiniband/uverbs{n}" for n in range(4)]

    argv = a_docker_run(tmp_path, monkeypatch, devices=devices)

    assert [a for a in argv if a.startswith("--device=")] == [f"--device={d}" for d in devices]
    assert argv[argv.index("--ulimit") + 1] == "memlock=-1:-1"
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "--mount"]
    assert any(m.endswith(",dst=/var/lib/gpujobs/checkpoints") for m in mounts)
    assert "GPUJOBS_LOCAL_CHECKPOINT_DIR=/var/lib/gpujobs/checkpoints\n" in argv[-1]  # through the env file


def test_docker_run_without_efa_gets_no_device_and_the_default_memlock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = a_docker_run(tmp_path, monkeypatch, devices=[])

    assert not any(a.startswith("--device") for a in argv)
    assert "--ulimit" not in argv


def test_a_gang_on_a_gpu_host_is_told_its_types_all_reduce_floor_and_a_single_node_is_told_none() -> None:
    doc = {**DOC, "interconnect_floors": {P5: 100.0}}

    floor = interconnect_floor(doc, P5, gpus_seen=True)
    env = an_env(instance_type=P5, interconnect_floor=floor)

    assert env[INTERCONNECT_FLOOR_ENV] == "100.000"
    assert env["GPUJOBS_INSTANCE_TYPE"] == P5
    assert interconnect_floor({**doc, "nodes": 1}, P5, gpus_seen=True) is None
    assert INTERCONNECT_FLOOR_ENV not in an_env(instance_type=P5, interconnect_floor=None)


def test_a_host_without_gpus_or_a_type_without_a_floor_measures_and_logs_only() -> None:
    """A CPU's gloo figure (the local cloud, a CPU type) says nothing of the type's fabric: floor 0."""
    doc = {**DOC, "interconnect_floors": {P5: 100.0}}

    assert interconnect_floor(doc, P5, gpus_seen=False) == 0.0
    assert interconnect_floor(doc, "g5.xlarge", gpus_seen=True) == 0.0
    assert an_env(interconnect_floor=0.0)[INTERCONNECT_FLOOR_ENV] == "0.000"
