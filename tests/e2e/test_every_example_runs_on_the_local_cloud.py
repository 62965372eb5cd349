"""Every spec under examples/ runs unchanged on the local cloud, as a new user would submit it.

The examples are written for the training image (`python /opt/gpujobs/examples/digits/train.py`,
an ECR image name). A local instance runs them as that image would (`gpujobs_local.container`:
the Dockerfile's tree, ENV, WORKDIR and ENTRYPOINT), so `gpujobs submit examples/X` is all a user
does. All of them are submitted at once, with their own step counts, and each must succeed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest

from gpujobs.domain.states import JobState
from gpujobs_cli.main import main as gpujobs_cli
from gpujobs_local.session import ROOT
from tests.e2e.conftest import Stage

pytestmark = [pytest.mark.integration, pytest.mark.training, pytest.mark.slow]

EXAMPLES = sorted((ROOT / "examples").glob("*.*"))


def _submit(stage: Stage, example: Path, capsys: pytest.CaptureFixture[str]) -> str:
    with mock.patch.dict(os.environ, stage.cloud.exports()):
        assert gpujobs_cli(["submit", str(example), "--json"]) == 0, capsys.readouterr().err
    job_id: str = json.loads(capsys.readouterr().out)["job_id"]
    return job_id


@pytest.mark.timeout(900)
def test_every_example_spec_succeeds_unchanged_on_the_local_cloud(
    stage: Stage, capsys: pytest.CaptureFixture[str]
) -> None:
    # given the repository's examples, written for the training image on AWS
    assert {p.name for p in EXAMPLES} >= {"digits.yaml", "digits-2node.yaml", "cpu-smoke.json"}

    # when a user submits each of them, unchanged
    jobs = {example.name: _submit(stage, example, capsys) for example in EXAMPLES}

    # then each one trains to the end and succeeds on its first attempt
    ended = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
    stage.wait("every example to end", lambda: all(stage.state(j) in ended for j in jobs.values()), timeout=780)
    for name, job_id in jobs.items():
        job = stage.job(job_id)
        logs = [stage.log_text(i)[-1500:] for a in job.attempts for i in a.instance_ids]
        assert job.state is JobState.SUCCEEDED, f"{name}: {job.state} {job.status_detail}\n{logs}"
        assert [a.number for a in job.attempts] == [1], name
        rank0 = job.attempts[0].instance_ids[0]
        final = stage.trainer_line(rank0, "final")
        assert final is not None, f"{name}: {logs}"
        assert final["step"] == int(job.spec.command[job.spec.command.index("--steps") + 1]), name
        assert len(job.attempts[0].instance_ids) == job.spec.nodes, name
    stage.wait_nothing_running()
    assert stage.failed_deliveries() == []
