"""The local cloud with its instances alive: `LocalCloud` (AWS on loopback, the real handlers) plus
an `InstanceRunner` that brings every instance the control plane launches to life with the real
bootstrap and trainer as local processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Job
from gpujobs_local.cloud import LocalCloud
from gpujobs_local.fis_agent import LocalFisAgent
from gpujobs_local.instances import InstanceRunner, instance_python_version
from gpujobs_local.ssm_agent import LocalSsmAgent
from gpujobs_local.stack import ROOT

INSTANCE_PYTHON_ENV = "GPUJOBS_LOCAL_INSTANCE_PYTHON"
"""The interpreter instances run the bootstrap with, when no `instance_python` is given (docs/instance.md)."""
SPOT_NOTICE_SECONDS = 30.0
"""The local cloud's notice before a drill's reclaim (`gpujobs interrupt`; EC2's is 120 s)."""
LOCAL_INSTANCE_TYPES = ("g5.12xlarge", "g6.12xlarge", "g5.xlarge", "g6.xlarge", "c7i.large")
"""The local stack's allow-list: multi-GPU types, because the demo runs 2 processes per node."""


def add_instance_python_option(parser: argparse.ArgumentParser) -> None:
    """`--instance-python PATH` (default `$GPUJOBS_LOCAL_INSTANCE_PYTHON`), checked before anything starts."""

    def checked(path: str) -> str:
        try:
            instance_python_version(path)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return path

    parser.add_argument(
        "--instance-python",
        type=checked,
        default=os.environ.get(INSTANCE_PYTHON_ENV) or None,
        metavar="PATH",
        help="the AMI's python3 each instance runs the bootstrap with (3.9+ with boto3; e.g. a pyenv 3.9 "
        f"for Amazon Linux 2023), default ${INSTANCE_PYTHON_ENV}, else this Python; the job still runs with this one",
    )


@dataclass
class LocalSession:
    cloud: LocalCloud
    runner: InstanceRunner

    @property
    def store(self) -> DynamoJobStore:
        return DynamoJobStore(table_name=self.cloud.outputs["JobsTableName"], client=self.cloud.client("dynamodb"))

    def job(self, job_id: str) -> Job:
        return self.store.get(job_id)

    def send(self, spec: dict[str, Any], *, sender: str | None = None) -> str:
        """Send `spec` (or a cancel) to the jobs queue as `sender` (None: moto's default user)."""
        return self.cloud.send(json.dumps(spec), sender=sender)

    def gpujobs(self, *argv: str) -> str:
        """Run the real `gpujobs` CLI in this process with the environment `local up` tells another
        shell to export; what it printed. RuntimeError naming the command when it exits non-zero."""
        from gpujobs_local.tour import cli

        exports = self.cloud.exports()
        saved = {key: os.environ.get(key) for key in exports}
        os.environ.update(exports)
        try:
            code, out = cli(*argv)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        if code != 0:
            raise RuntimeError(f"gpujobs {' '.join(argv)} exited {code}: {out.strip()}")
        return out


def attach_runner(
    cloud: LocalCloud,
    *,
    workdir: Path,
    grace_seconds: float = 20.0,
    wait_timeout: float = 60.0,
    instance_python: str | None = None,
    spot_notice_seconds: float = SPOT_NOTICE_SECONDS,
) -> InstanceRunner:
    """Bring every instance the control plane launches on `cloud` to life, on the cloud's own loop.
    `instance_python`: the AMI's python3 the bootstrap runs with (default `$GPUJOBS_LOCAL_INSTANCE_PYTHON`,
    else this Python); the workload still runs with this one, as the image's interpreter.
    `spot_notice_seconds`: how long after a drill's warning (`gpujobs interrupt`, played from FIS by
    `fis_agent`) its instance is reclaimed, at most the experiment's own notice."""
    assert cloud.stack is not None, "start the cloud first"
    stack, sts = cloud.stack, cloud.client("sts")
    python_bin = str(Path(sys.executable).parent)
    runner = InstanceRunner(
        ec2=cloud.client("ec2"),
        stack_name=cloud.stack.stack_name,
        emit=cloud.put_event,
        workdir=workdir,
        # `python` in a job's command is the image's interpreter; here, this environment's.
        env={
            **os.environ,
            **cloud.exports(),
            "PATH": f"{python_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "AWS_ENDPOINT_URL_LAMBDA": cloud.lambda_endpoint_url,  # the credentials function
        },
        images=True,
        grace_seconds=grace_seconds,
        instance_python=instance_python or os.environ.get(INSTANCE_PYTHON_ENV) or None,
        bootstrap_args=["--wait-timeout", str(int(wait_timeout))],
        cwd=ROOT,
        # each instance's own instance-role session, from its IMDS (the credentials function checks it)
        instance_credentials=lambda iid: stack.instance_credentials(iid, sts=sts),
        instance_role_name=stack.instance_role_arn.rsplit("/", 1)[-1],
    )
    cloud.add_tick(runner.poll)
    cloud.add_shutdown(runner.stop_all)
    agent = LocalSsmAgent(ssm=cloud.client("ssm"), runner=runner, document_name=cloud.stack.checkpoint_document)
    cloud.add_tick(agent.poll)
    fis = LocalFisAgent(
        fis=cloud.client("fis"), ec2=cloud.client("ec2"), runner=runner, notice_seconds=spot_notice_seconds
    )
    cloud.add_tick(fis.poll)
    return runner


@contextmanager
def local_session(
    *,
    workdir: Path,
    reconcile_every: float = 5.0,
    grace_seconds: float = 20.0,
    wait_timeout: float = 60.0,
    teams: str | None = None,
    instance_python: str | None = None,
    spot_notice_seconds: float = SPOT_NOTICE_SECONDS,
    allowed_instance_types: Sequence[str] = LOCAL_INSTANCE_TYPES,
) -> Iterator[LocalSession]:
    """Start the local cloud and its instance runner; stop both, leaving nothing running.
    `teams`: a team configuration (JSON, docs/deploy.md "Teams"); None runs the stack without one.
    `allowed_instance_types`: the stack's allow-list (a story on another type widens it).
    `instance_python`, `spot_notice_seconds`: the bootstrap's interpreter, a drill's notice (`attach_runner`)."""
    cloud = LocalCloud(
        workdir=workdir, reconcile_every=reconcile_every, allowed_instance_types=allowed_instance_types, teams=teams
    )
    cloud.start()
    try:
        runner = attach_runner(
            cloud,
            workdir=workdir,
            grace_seconds=grace_seconds,
            wait_timeout=wait_timeout,
            instance_python=instance_python,
            spot_notice_seconds=spot_notice_seconds,
        )
        yield LocalSession(cloud=cloud, runner=runner)
    finally:
        cloud.stop()
