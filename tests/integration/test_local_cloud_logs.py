"""A job's output outlives its instance on the local cloud, and the CLI reads it as it would on AWS.

The real submit handler launches, the instance runner boots the real bootstrap (process runtime,
the job's command run directly), the bootstrap ships to moto's CloudWatch Logs, and `gpujobs logs`
and `gpujobs status` read the stack's job log group through the exports a user sources.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.states import JobState
from gpujobs.service.ports import JobNotFoundError
from gpujobs_cli.main import main
from gpujobs_local.cloud import LocalCloud
from gpujobs_local.instances import InstanceRunner
from gpujobs_local.session import LOCAL_INSTANCE_TYPES

pytestmark = pytest.mark.integration

FAILS_AFTER_PRINTING = (
    "import sys\nfor step in range(1, 4):\n    print(f'step {step} loss {1 / step:.2f}')\nsys.exit(3)"
)


def printed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What the CLI printed; the handlers on this process's loop print their metrics (EMF) too."""
    return [line for line in capsys.readouterr().out.splitlines() if not line.startswith('{"_aws"')]


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[LocalCloud]:
    cloud = LocalCloud(workdir=tmp_path, allowed_instance_types=LOCAL_INSTANCE_TYPES, reconcile_every=60)
    cloud.start()
    try:
        assert cloud.stack is not None
        runner = InstanceRunner(
            ec2=cloud.client("ec2"),
            stack_name=cloud.stack.stack_name,
            emit=cloud.put_event,
            workdir=tmp_path,
            env={**os.environ, **cloud.exports(), "PYTHONUNBUFFERED": "1"},
            entrypoint="",
        )
        cloud.add_tick(runner.poll)
        cloud.add_shutdown(runner.stop_all)
        # restored before cloud.stop() restores what the process had before the cloud (a monkeypatch made
        # before the cloud would be undone after it, putting the stopped server's endpoint back)
        with mock.patch.dict(os.environ, cloud.exports()):
            yield cloud
    finally:
        cloud.stop()


@pytest.mark.timeout(120)
def test_a_failed_jobs_output_is_read_back_by_gpujobs_logs_and_status(
    cloud: LocalCloud, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a job whose only attempt prints three steps and fails
    spec = {
        "name": "prints-then-fails",
        "image": "unused-by-the-process-runtime",
        "command": [sys.executable, "-c", FAILS_AFTER_PRINTING],
        "gpus_per_node": 1,
        "instance_types": ["g5.xlarge"],
        "max_attempts": 1,
        "client_token": "logs-story",
    }
    spec_file = cloud.workdir / "job.json"
    spec_file.write_text(json.dumps(spec))
    assert main(["submit", str(spec_file)]) == 0
    job_id = capsys.readouterr().out.strip()

    # when it has failed and its instance is gone
    store = DynamoJobStore(table_name=cloud.outputs["JobsTableName"], client=cloud.client("dynamodb"))

    def failed() -> bool:
        try:
            return store.get(job_id).state is JobState.FAILED
        except JobNotFoundError:  # not recorded yet
            return False

    cloud.wait_until(failed, timeout=90, what="the job to fail")

    # then `gpujobs logs` prints what rank 0 printed, and its bootstrap log
    capsys.readouterr()
    assert main(["logs", job_id]) == 0
    assert printed(capsys) == ["step 1 loss 1.00", "step 2 loss 0.50", "step 3 loss 0.33"]
    assert main(["logs", job_id, "--bootstrap"]) == 0
    assert any("gpujobs-bootstrap: exited: workload exited with 3" in line for line in printed(capsys))
    # and `gpujobs status` shows the last lines under the failed job
    assert main(["status", job_id]) == 0
    status = "\n".join(printed(capsys))
    assert f"last lines of attempt 1, node 0 (gpujobs logs {job_id} --attempt 1 --node 0):" in status
    assert status.rstrip().endswith("  step 3 loss 0.33")
