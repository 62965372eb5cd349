"""On the local cloud, the job of the issue's report: the example's command names a script that is
not there. The real bootstrap starts the real launcher, which finds the script missing before
torchrun would turn it into a crash; the job fails at once with Python's own line, and `gpujobs
status` shows it, instead of crashing three times in twenty seconds."""

from __future__ import annotations

import os
import re
from unittest import mock

import pytest

from gpujobs.domain.states import JobState, Reason
from gpujobs_cli.main import main as gpujobs_cli
from tests.e2e.conftest import Stage, digits_spec

pytestmark = [pytest.mark.integration, pytest.mark.training]

MISSING = "/opt/gpujobs/examples/digits/not-here/train.py"


@pytest.mark.timeout(240)
def test_a_script_that_is_not_there_fails_the_job_at_once_with_its_error_line(
    stage: Stage, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a spec whose command names a script the image does not have
    job_id = stage.submit(digits_spec(command=["python", MISSING, "--steps", "10"]))

    # then its first attempt ends the job FAILED (config-error), with no second attempt
    job = stage.wait_state(job_id, JobState.FAILED, timeout=120)
    assert job.history[-1].reason is Reason.CONFIG_ERROR
    assert len(job.attempts) == 1
    # the image's path as the workload saw it: on the local cloud, under the instance's copy of the image
    error = re.compile(rf"can't open file '(?:\S*/rootfs)?{re.escape(MISSING)}'")
    assert error.search(job.attempts[0].error_line)
    stage.wait_nothing_running()

    # and `gpujobs status` shows why
    with mock.patch.dict(os.environ, stage.cloud.exports()):
        assert gpujobs_cli(["status", job_id]) == 0
    page = capsys.readouterr().out
    assert "state     FAILED" in page
    assert "exit messages:" in page
    assert error.search(page.split("exit messages:")[1])
