"""A whole job on the local cloud with every instance's bootstrap under the AMI's Python.

On EC2 the bootstrap runs on the AMI's own python3, 3.9 on Amazon Linux 2023, and the job in its
image. The local cloud plays that with `instance_python` (`gpujobs local up --instance-python`):
here pyenv's 3.9 in an environment holding only boto3 (tests/ami_pythons.py), while the trainer
keeps this environment's Python and torch, the image's. The job's checkpoints go to S3 with the
job role's credentials, which the bootstrap serves: the path that answered 503 under 3.9 and 3.10
while it called `datetime.UTC`.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpujobs.domain.states import JobState
from tests.conftest import ami_bootstrap_python
from tests.e2e.conftest import Stage, digits_spec

pytestmark = [pytest.mark.integration, pytest.mark.training]

PYTHON = "3.9"
"""Amazon Linux 2023's python3, the oldest the bootstrap supports."""


@pytest.fixture
def session_options() -> dict[str, Any]:
    return {"instance_python": ami_bootstrap_python(PYTHON).path}


@pytest.mark.timeout(240)
def test_a_job_succeeds_with_its_bootstrap_on_python_3_9_and_its_trainer_in_the_image(stage: Stage) -> None:
    # given a local cloud whose instances run the bootstrap with Python 3.9
    version = ami_bootstrap_python(PYTHON).version

    # when a short digits job runs to the end
    job_id = stage.submit(digits_spec(steps=80, checkpoint_every=40))
    job = stage.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=150)

    # then it succeeded, its checkpoints reached S3 with the job role's credentials the bootstrap served
    assert job.state is JobState.SUCCEEDED, job.status_detail
    (instance,) = job.attempts[0].instance_ids
    log = stage.log_text(instance)
    assert f"gpujobs-bootstrap: Python {version} at " in log
    assert "the workload gets the job role's credentials from http://127.0.0.1:" in log
    assert job.checkpoint_step is not None
    assert job.checkpoint_step >= 40
    final = stage.trainer_line(instance, "final")
    assert final is not None, log[-2000:]
    assert final["step"] == 80
    stage.wait_nothing_running()
    assert stage.failed_deliveries() == []
