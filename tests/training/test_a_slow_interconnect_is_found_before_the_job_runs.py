"""A multi-node gang's all-reduce check (issue 22, item 5): before any of the job's code runs, the
launcher measures the gang's all-reduce bus bandwidth over its own rendezvous and, below the floor
the bootstrap set, exits 123 so that the gang is relaunched on other hosts.

Real torchrun, 2 ranks over gloo on CPU, on the rendezvous a gang uses (a master address and port,
not torchrun's standalone one): the check's torchrun and the workload's meet at the same port.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpujobs_trainer.errors import CONFIG_ERROR_EXIT_CODE, SLOW_INTERCONNECT_EXIT_CODE
from gpujobs_trainer.interconnect import FLOOR_ENV, INSTANCE_TYPE_ENV, bus_bandwidth_gbs
from tests.training.test_job_dependencies import launch as run_launcher

MEASURED = "all-reduce bus bandwidth"
WORKLOAD = "import os, pathlib; pathlib.Path('ran-' + os.environ['RANK']).write_text('trained')"
SETUP = "import pathlib; pathlib.Path('setup-ran').write_text('set up')"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(workdir: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """The launcher as a container runs it, one node of 2 ranks, with a `setup:` command and a
    workload that each leave a file in the working directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOBS_", "PIP_", "VIRTUAL_ENV"))}
    env.update(
        GPUJOBS_NPROC_PER_NODE="2",
        GPUJOBS_MASTER_ADDR="127.0.0.1",
        GPUJOBS_MASTER_PORT=str(free_port()),
        GPUJOBS_JOB_ID="j-interconnect",
        GPUJOBS_CHECKPOINT_MODE="none",
        GPUJOBS_SETUP=json.dumps([[sys.executable, "-c", SETUP]]),
        TMPDIR=str(workdir),
        **extra,
    )
    return run_launcher(workdir, env, sys.executable, "-c", WORKLOAD)


def trained(workdir: Path) -> list[str]:
    """The ranks whose workload ran."""
    return sorted(path.name for path in workdir.glob("ran-*"))


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_the_check_measures_the_slowest_ranks_bus_bandwidth_and_each_node_writes_it(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python"]
    argv += [sys.executable, "-m", "gpujobs_trainer.interconnect", "--out", str(out)]
    subprocess.run(argv, cwd=tmp_path, check=True, timeout=240, capture_output=True)

    figure = json.loads(out.read_text())
    assert (figure["ranks"], figure["nodes"], figure["bytes"]) == (2, 1, 8 * 2**20)  # 8 MiB on CPU
    assert figure["seconds"] > 0
    assert figure["busbw_gbs"] == pytest.approx(
        bus_bandwidth_gbs(nbytes=figure["bytes"], seconds=figure["seconds"], ranks=2)
    )
    assert figure["busbw_gbs"] > 0


def test_with_a_floor_of_zero_the_figure_is_logged_and_the_job_runs(tmp_path: Path) -> None:
    result = launch(tmp_path, **{FLOOR_ENV: "0"})

    assert result.returncode == 0, result.stderr
    measured = [line for line in lines(result.stderr) if MEASURED in line]
    assert len(measured) == 1
    assert "across 1 node (2 ranks)" in measured[0]
    assert "floor 0: measured only" in measured[0]
    assert (tmp_path / "setup-ran").exists()
    assert trained(tmp_path) == ["ran-0", "ran-1"]


def test_below_the_floor_the_launcher_exits_123_before_setup_or_the_workload(tmp_path: Path) -> None:
    result = launch(tmp_path, **{FLOOR_ENV: "1000000", INSTANCE_TYPE_ENV: "p4d.24xlarge"})

    assert result.returncode == SLOW_INTERCONNECT_EXIT_CODE, result.stderr
    last = lines(result.stderr)[-1]
    assert MEASURED in last
    assert "GB/s across 1 node (2 ranks)" in last
    assert "is below p4d.24xlarge's floor of 1000000.00 GB/s" in last
    assert last.endswith("relaunched on other hosts")
    assert not (tmp_path / "setup-ran").exists()
    assert trained(tmp_path) == []


def test_without_a_floor_no_check_runs(tmp_path: Path) -> None:
    result = launch(tmp_path)

    assert result.returncode == 0, result.stderr
    assert "all-reduce" not in result.stderr
    assert "gpujobs_trainer.interconnect" not in result.stderr  # no check's torchrun was launched
    assert trained(tmp_path) == ["ran-0", "ran-1"]


def test_a_floor_that_is_not_a_number_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    result = launch(tmp_path, **{FLOOR_ENV: "fast"})

    assert result.returncode == CONFIG_ERROR_EXIT_CODE, result.stderr
    assert FLOOR_ENV in lines(result.stderr)[-1]
    assert not (tmp_path / "setup-ran").exists()
    assert trained(tmp_path) == []
