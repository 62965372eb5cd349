"""Issue 22, item 3: the job's log and its exit message are the workload's words, not our noise.

`gpujobs status` shows an attempt's exit message: the last line its workload wrote on stderr. The
launcher's own progress lines come after the workload's (it logs torchrun's exit), so they used to
be that message ("torchrun exited 1; job outcome: crash"), hiding the error that ended the job; and
the launcher's INFO logging printed botocore's endpoint and credential lines into every job's log.
"""

from __future__ import annotations

import os
import subprocess
import sys

from gpujobs.instance.runtimes import ProcessRuntime

CRASH = r"""
import sys
sys.stderr.write('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n')
sys.stderr.write('ValueError: learning rate must be positive, got -0.1\n')
sys.stderr.write('[gpujobs rank 0] INFO saved nothing: the step failed\n')
sys.stderr.write('[gpujobs launch] INFO torchrun exited 1; job outcome: crash (exit 1)\n\n')
sys.exit(1)
"""


def exit_message(script: str) -> str:
    runtime = ProcessRuntime(entrypoint=[sys.executable, "-c", script])
    runtime.start({"command": []}, {})
    assert runtime.wait() != 0
    return runtime.last_line


def test_a_crash_is_explained_by_the_workloads_last_error_not_by_the_launchers_summary() -> None:
    assert exit_message(CRASH) == "ValueError: learning rate must be positive, got -0.1"


def test_the_launchers_own_error_is_still_the_message_when_it_is_the_reason() -> None:
    config_error = (
        "import sys; sys.stderr.write('[gpujobs launch] INFO launching\\n"
        "[gpujobs launch] ERROR command argument 2: ${GPUJOBS_NOPE} is not set for this job\\n'); sys.exit(78)"
    )

    assert (
        exit_message(config_error)
        == "[gpujobs launch] ERROR command argument 2: ${GPUJOBS_NOPE} is not set for this job"
    )


def test_a_launcher_process_prints_no_botocore_info_line() -> None:
    """The launcher's own process, as the container runs it: a boto3 client made with an endpoint
    and credentials from the environment says nothing about either."""
    script = (
        "import boto3, logging; from gpujobs_trainer.launch import configure_logging; configure_logging();"
        " boto3.client('s3', region_name='us-east-1'); logging.getLogger('gpujobs_trainer.launch').info('ready')"
    )
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )

    assert done.stderr.strip() == "[gpujobs launch] INFO ready"
