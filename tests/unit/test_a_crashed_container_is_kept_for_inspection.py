"""The bootstrap's side of `keep_on_failure`: after a crash (not 0, not 75) it keeps the host up and
the crashed container's filesystem, idle under the same name, and still reports the exit.

Stories: docker (a fake CLI that records its argv) runs the workload without `--rm`; after a crash
the container is committed, removed and run again from that image with `sleep infinity`, confined
and mounted as before but with no env file; a clean exit keeps nothing. The whole bootstrap (process
runtime) publishes a crash as before and schedules its power-off after the keep instead of now; a
clean exit, or a document without a keep, powers off at once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpujobs.instance import rundoc, runtimes
from gpujobs.instance.errors import BootstrapError
from gpujobs.instance.userdata import render_user_data
from tests.unit.fake_imds import FakeImds
from tests.unit.test_bootstrap import BUCKET, INSTANCE_ID, REGION, Bus, a_document, bus, run_bootstrap

__all__ = ["bus"]  # the fixture

RECORDING_DOCKER = """import json, os, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\\n")
if argv[0] == "run" and "--detach" not in argv:
    sys.exit(int(os.environ["WORKLOAD_EXIT"]))
"""


def a_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, workload_exit: int) -> runtimes.DockerRuntime:
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{RECORDING_DOCKER}")
    docker.chmod(0o755)
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("WORKLOAD_EXIT", str(workload_exit))
    runtime = runtimes.DockerRuntime(str(docker))
    runtime.cgroup_parent = "gpujobs-workload.slice"
    runtime.mounts.append("type=bind,src=/var/lib/gpujobs/outputs-1,dst=/var/lib/gpujobs/outputs")
    return runtime


def calls(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]


def kept_document(**changes: Any) -> dict[str, Any]:
    fields = {
        "job_id": "j-0123456789abcdef",
        "attempt": 2,
        "name": "n",
        "image": "repo/train:1",
        "command": ["python", "train.py"],
        "gpus_per_node": 1,
        "checkpoint_uri": "s3://b/k",
        "keep_on_failure_seconds": 1800,
    }
    return rundoc.check_document({**fields, **changes})


def test_a_crashed_container_is_committed_and_run_idle_under_its_name_confined_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = a_docker(tmp_path, monkeypatch, workload_exit=1)
    doc = kept_document()
    runtime.start(doc, {"GPUJOBS_JOB_ID": doc["job_id"], "TOKEN": "secret"})
    assert runtime.wait() == 1

    assert runtime.keep_for_inspection(doc)

    name = "gpujobs-j-0123456789abcdef-a2"
    image = f"gpujobs-kept/{name}:latest"
    clear, run, commit, remove, idle = calls(tmp_path)
    assert clear == ["rm", "--force", name]  # a container an earlier run of this node left
    assert run[:3] == ["run", "--name", name]  # no --rm: the crashed filesystem outlives the workload
    assert commit == ["commit", name, image]
    assert remove == ["rm", name]
    assert idle[:4] == ["run", "--detach", "--name", name]
    assert idle[-4:] == ["--entrypoint", "sleep", image, "infinity"]
    options = idle[4:-4]
    for given in (["--gpus", "all"], ["--user", "10001:10001"], ["--cgroup-parent", "gpujobs-workload.slice"]):
        assert any(options[i : i + 2] == given for i in range(len(options))), given
    assert "--cap-drop" in options
    assert "--mount" in options
    assert "--env-file" not in idle  # none of the job's env or secrets


def test_without_a_keep_the_workload_runs_with_rm_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = a_docker(tmp_path, monkeypatch, workload_exit=1)
    runtime.start(kept_document(keep_on_failure_seconds=0), {})
    assert runtime.wait() == 1

    [run] = calls(tmp_path)
    assert run[:2] == ["run", "--rm"]


def test_a_keep_longer_than_a_day_is_refused_by_the_bootstrap() -> None:
    with pytest.raises(BootstrapError, match="keep_on_failure_seconds 90000 is not 0 to 86400"):
        kept_document(keep_on_failure_seconds=90_000)


@pytest.mark.parametrize("case", [(3, 1800, "-h +40"), (0, 1800, "-h now"), (75, 1800, "-h now"), (3, 0, "-h now")])
def test_a_crash_under_keep_on_failure_is_reported_and_the_host_powers_off_only_after_the_keep(
    tmp_path: Path, bus: Bus, moto_endpoint: str, case: tuple[int, int, str]
) -> None:
    exit_code, keep, power_off = case
    doc = a_document(tmp_path, bus, exit_code=exit_code, keep_on_failure_seconds=keep)
    user_data = tmp_path / "user-data"
    user_data.write_bytes(render_user_data(doc, bucket=BUCKET, region=REGION))
    with FakeImds(user_data=b"", instance_id=INSTANCE_ID) as imds:
        code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--user-data", str(user_data))

    assert code == exit_code, output
    [exited] = bus.exits()
    assert (exited["exit_code"], exited["reason"]) == (exit_code, "exited")
    assert (tmp_path / "shutdown").read_text() == power_off
    assert ("keeps this host up for inspection" in output) == (power_off != "-h now")
