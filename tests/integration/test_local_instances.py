"""Local EC2 instances: moto launches them, `InstanceRunner` runs the real bootstrap for each.

Stories: an instance runs its job and reports the exit code, then terminates; the control plane's
TerminateInstances reaches the workload as SIGTERM; a spot interruption shows up in the instance's IMDS
and as an event before the instance goes; a crash reports nothing but the state changes; the digits
example trains through bootstrap + launcher + torchrun into S3; a job that cannot run in its image
exits as docker would (127, 125) with the line that says why in its exit report; and nothing is
left running after `stop_all`.
"""

from __future__ import annotations

import json
import os
import platform
import random
import signal
import socket
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from gpujobs.domain.job_access import session_policy_json, session_tags
from gpujobs.domain.rundoc import RunDocument
from gpujobs.instance.userdata import render_user_data
from gpujobs_local.instances import REBALANCE, SPOT_WARNING, STATE_CHANGE, InstanceRunner
from gpujobs_local.processes import RENDEZVOUS_PORTS, free_port
from tests.ami_pythons import find_interpreter
from tests.conftest import BootstrapPython
from tests.granting_credentials_function import FUNCTION, GrantingCredentialsFunction, granting_credentials_function

pytestmark = [pytest.mark.integration, pytest.mark.training]

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
STACK = "gpujobs-local-test"
JOB_ROLE = "arn:aws:iam::123456789012:role/gpujobs-local-JobRole"
INSTANCE_ROLE = f"arn:aws:iam::123456789012:role/{STACK}-InstanceRole"

EXITS = "import sys; sys.exit(int(sys.argv[1]))"
WAITS_FOR_SIGTERM = textwrap.dedent(
    """
    import os, signal, sys, time
    def stop(signum, frame):
        open(os.environ["OUT_FILE"], "w").write(str(signum))
        sys.exit(75)
    signal.signal(signal.SIGTERM, stop)
    open(os.environ["READY_FILE"], "w").close()
    time.sleep(120)
    """
)
WATCHES_SPOT_NOTICE = textwrap.dedent(
    """
    import json, os, signal, sys, time, urllib.request, urllib.error
    base = os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"]
    def stop(signum, frame):
        open(os.environ["OUT_FILE"], "a").write("sigterm\\n")
        sys.exit(75)
    signal.signal(signal.SIGTERM, stop)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    put = urllib.request.Request(base + "/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    token = opener.open(put).read().decode()
    open(os.environ["READY_FILE"], "w").close()
    while True:
        get = urllib.request.Request(base + "/latest/meta-data/spot/instance-action",
                                     headers={"X-aws-ec2-metadata-token": token})
        try:
            notice = json.loads(opener.open(get).read())
        except urllib.error.HTTPError as exc:
            assert exc.code == 404, exc.code
            time.sleep(0.1)
            continue
        open(os.environ["OUT_FILE"], "a").write(json.dumps(notice) + "\\n")
        time.sleep(120)
    """
)
IGNORES_SIGTERM = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    open(os.environ["READY_FILE"], "w").close()
    time.sleep(300)
    """
)


class Cloud:
    """Just enough of AWS for the instances: a subnet, the stack's bus (captured by a rule -> SQS),
    and `emit` for the EC2 events (recorded in order, and put on the default bus)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.kwargs: dict[str, Any] = {
            "endpoint_url": endpoint,
            "region_name": REGION,
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
        self.ec2 = boto3.client("ec2", **self.kwargs)
        self.events = boto3.client("events", **self.kwargs)
        self.sqs = boto3.client("sqs", **self.kwargs)
        self.s3 = boto3.client("s3", **self.kwargs)
        vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnet = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
        self.bus = f"gpujobs-{uuid.uuid4().hex[:8]}"
        self.events.create_event_bus(Name=self.bus)
        self.exits_queue = self._capture(self.bus, {"source": ["gpujobs.instance"]})
        self.ec2_queue = self._capture("default", {"source": ["aws.ec2"], "resources": [{"prefix": "arn:aws:ec2"}]})
        self.emitted: list[dict[str, Any]] = []

    def _capture(self, bus: str, pattern: dict[str, Any]) -> str:
        name = f"q-{uuid.uuid4().hex[:8]}"
        url: str = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.events.put_rule(Name=name, EventBusName=bus, EventPattern=json.dumps(pattern))
        self.events.put_targets(Rule=name, EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
        return url

    def emit(self, *, source: str, detail_type: str, detail: dict[str, Any], resources: list[str]) -> None:
        self.emitted.append({"detail-type": detail_type, "detail": detail, "resources": resources})
        entry = {"Source": source, "DetailType": detail_type, "Detail": json.dumps(detail), "Resources": resources}
        assert not self.events.put_events(Entries=[entry])["FailedEntryCount"]

    def received(self, queue: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        while True:
            messages = self.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return found
            for message in messages:
                found.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])

    def exits(self) -> list[dict[str, Any]]:
        return [e["detail"] for e in self.received(self.exits_queue)]

    def instance_credentials(self, instance_id: str) -> dict[str, Any]:
        """What EC2 gives the instance: the instance role's session, named after it."""
        sts = boto3.client("sts", **self.kwargs)
        return dict(sts.assume_role(RoleArn=INSTANCE_ROLE, RoleSessionName=instance_id)["Credentials"])

    def states(self, instance_id: str) -> list[str]:
        return [
            e["detail"]["state"]
            for e in self.emitted
            if e["detail-type"] == STATE_CHANGE and e["detail"]["instance-id"] == instance_id
        ]

    def ec2_state(self, instance_id: str) -> str:
        reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        state: str = reservations[0]["Instances"][0]["State"]["Name"]
        return state

    def launch(self, *, command: list[str], count: int = 1, spot: bool = False, **fields: Any) -> list[str]:
        job_id = fields.pop("job_id", f"job-{uuid.uuid4().hex[:8]}")
        attempt = fields.pop("attempt", 1)
        document: dict[str, Any] = {
            "job_id": job_id,
            "attempt": attempt,
            "name": "local",
            "image": "unused-by-the-process-runtime",
            "command": command,
            "nodes": count,
            "gpus_per_node": 0,
            "checkpoint_uri": f"s3://unused/jobs/{job_id}/ckpt",
            "event_bus": self.bus,
            "region": REGION,
            "stop_timeout_seconds": 5,
        }
        doc = RunDocument(**{**document, **fields})
        tags = [
            {"Key": "gpujobs:stack", "Value": STACK},
            {"Key": "gpujobs:job-id", "Value": job_id},
            {"Key": "gpujobs:attempt", "Value": str(attempt)},
        ]
        extra: dict[str, Any] = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        reservation = self.ec2.run_instances(
            ImageId="ami-12c6146b",
            InstanceType="g5.xlarge",
            MinCount=count,
            MaxCount=count,
            SubnetId=self.subnet,
            UserData=render_user_data(doc, bucket="unused", region=REGION),
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            **extra,
        )
        return [i["InstanceId"] for i in sorted(reservation["Instances"], key=lambda i: i["AmiLaunchIndex"])]


@pytest.fixture
def cloud(moto_endpoint: str) -> Cloud:
    return Cloud(moto_endpoint)


def instance_env(endpoint: str) -> dict[str, str]:
    return {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }


@pytest.fixture
def credentials_function(moto_endpoint: str) -> Iterator[tuple[str, GrantingCredentialsFunction]]:
    """(its Lambda endpoint, the function): a credentials function granting every ask the job role."""
    with granting_credentials_function(moto_endpoint, role_arn=JOB_ROLE) as served:
        yield served


@pytest.fixture
def make_runner(
    cloud: Cloud, tmp_path: Path, credentials_function: tuple[str, GrantingCredentialsFunction]
) -> Iterator[Callable[..., InstanceRunner]]:
    runners: list[InstanceRunner] = []

    def make(**options: Any) -> InstanceRunner:
        settings: dict[str, Any] = {"grace_seconds": 5.0, "entrypoint": "", **options}
        runner = InstanceRunner(
            ec2=cloud.ec2,
            stack_name=STACK,
            emit=cloud.emit,
            workdir=tmp_path / "cloud",
            env={**instance_env(cloud.endpoint), "AWS_ENDPOINT_URL_LAMBDA": credentials_function[0]},
            instance_credentials=cloud.instance_credentials,
            instance_role_name=INSTANCE_ROLE.rsplit("/", 1)[-1],
            **settings,
        )
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.stop_all(timeout=1)
        assert_all_gone(runner)


def assert_all_gone(runner: InstanceRunner) -> None:
    for pgid in runner.process_groups():
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


def poll_until(runner: InstanceRunner, condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        runner.poll()
        if condition():
            return
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {iid}\n{runner.log_path(iid).read_text()}" for iid in runner.instances)
            raise AssertionError(f"condition not met after {timeout}s\n{logs}")
        time.sleep(0.1)


def wait_for_file(runner: InstanceRunner, path: Path, timeout: float = 30.0) -> None:
    poll_until(runner, path.exists, timeout)


@pytest.mark.timeout(180)
def test_an_instance_runs_its_job_reports_the_exit_code_and_terminates(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner]
) -> None:
    runner = make_runner()
    [iid] = cloud.launch(command=[sys.executable, "-c", EXITS, "3"])

    poll_until(runner, lambda: runner.instances.get(iid) is not None and runner.instances[iid].state == "terminated")

    inst = runner.instances[iid]
    assert inst.exit_code == 3
    assert cloud.states(iid) == ["running", "shutting-down", "terminated"]
    assert cloud.ec2_state(iid) == "terminated"
    [exited] = cloud.exits()
    assert (exited["instance_id"], exited["exit_code"], exited["reason"]) == (iid, 3, "exited")
    assert runner.log_path(iid) == inst.log_path
    assert "workload exited with 3" in runner.log_path(iid).read_text()
    on_the_bus = [e for e in cloud.received(cloud.ec2_queue) if e["detail"]["instance-id"] == iid]
    assert [e["detail"]["state"] for e in on_the_bus] == ["running", "shutting-down", "terminated"]
    assert all(e["resources"] == [inst.arn] and e["source"] == "aws.ec2" for e in on_the_bus)
    assert inst.arn.startswith(f"arn:aws:ec2:{REGION}:")
    assert inst.arn.endswith(f":instance/{iid}")
    runner.poll()
    assert cloud.states(iid) == ["running", "shutting-down", "terminated"]  # nothing twice


@pytest.mark.timeout(180)
def test_an_instance_launched_while_boots_are_held_boots_only_when_they_are_released(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner]
) -> None:
    runner = make_runner()
    with runner.boots_held():
        [iid] = cloud.launch(command=[sys.executable, "-c", EXITS, "0"])
        runner.poll()
        runner.poll()
        assert iid not in runner.instances  # still being provisioned: no bootstrap, no events
        assert cloud.states(iid) == []

    poll_until(runner, lambda: runner.instances.get(iid) is not None and runner.instances[iid].state == "terminated")

    assert runner.instances[iid].exit_code == 0
    assert cloud.states(iid) == ["running", "shutting-down", "terminated"]


@pytest.mark.timeout(180)
def test_terminate_instances_sigterms_the_workload_within_the_grace(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner], tmp_path: Path
) -> None:
    runner = make_runner()
    out, ready = tmp_path / "signal", tmp_path / "ready"
    [iid] = cloud.launch(
        command=[sys.executable, "-c", WAITS_FOR_SIGTERM], env={"OUT_FILE": str(out), "READY_FILE": str(ready)}
    )
    wait_for_file(runner, ready)

    cloud.ec2.terminate_instances(InstanceIds=[iid])  # the control plane
    started = time.monotonic()
    poll_until(runner, lambda: runner.instances[iid].state == "terminated", timeout=runner.grace_seconds + 5)

    assert time.monotonic() - started < runner.grace_seconds
    assert out.read_text() == str(int(signal.SIGTERM))
    assert cloud.states(iid) == ["running", "shutting-down", "terminated"]
    [exited] = cloud.exits()
    assert exited["exit_code"] == 75
    assert runner.instances[iid].exit_code == 75


@pytest.mark.timeout(180)
def test_a_spot_interruption_shows_in_imds_and_terminates_after_the_notice(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner], tmp_path: Path
) -> None:
    runner = make_runner()
    out, ready = tmp_path / "notice", tmp_path / "ready"
    [iid] = cloud.launch(
        command=[sys.executable, "-c", WATCHES_SPOT_NOTICE],
        env={"OUT_FILE": str(out), "READY_FILE": str(ready)},
        spot=True,
    )
    wait_for_file(runner, ready)

    runner.rebalance(iid)
    interrupted = time.monotonic()
    runner.interrupt_spot(iid, notice_seconds=2.0)
    wait_for_file(runner, out, timeout=10)
    seen_running = cloud.ec2_state(iid)
    poll_until(runner, lambda: runner.instances[iid].state == "terminated", timeout=20)

    assert seen_running == "running"
    notice, sigterm = out.read_text().splitlines()
    assert json.loads(notice)["action"] == "terminate"
    assert sigterm == "sigterm"
    assert time.monotonic() - interrupted >= 2.0
    warnings = [e for e in cloud.emitted if e["detail-type"] == SPOT_WARNING]
    assert [w["detail"] for w in warnings] == [{"instance-id": iid, "instance-action": "terminate"}]
    assert [e["detail"] for e in cloud.emitted if e["detail-type"] == REBALANCE] == [{"instance-id": iid}]
    assert cloud.states(iid) == ["running", "shutting-down", "terminated"]
    assert cloud.ec2_state(iid) == "terminated"
    assert [e["exit_code"] for e in cloud.exits()] == [75]


@pytest.mark.timeout(180)
def test_a_crash_reports_no_exit_but_the_instance_terminates(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner], tmp_path: Path
) -> None:
    runner = make_runner()
    out, ready = tmp_path / "signal", tmp_path / "ready"
    [iid] = cloud.launch(
        command=[sys.executable, "-c", WAITS_FOR_SIGTERM], env={"OUT_FILE": str(out), "READY_FILE": str(ready)}
    )
    wait_for_file(runner, ready)
    groups = runner.process_groups()

    runner.crash(iid)
    for _ in range(5):
        runner.poll()

    assert len(groups) >= 2  # the bootstrap's and the workload's
    assert_all_gone(runner)
    assert not out.exists()  # SIGKILL: no chance to react
    assert cloud.states(iid) == ["running", "shutting-down", "terminated"]
    assert cloud.ec2_state(iid) == "terminated"
    time.sleep(0.5)
    assert cloud.exits() == []


@pytest.mark.timeout(180)
def test_stop_all_leaves_nothing_running(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner], tmp_path: Path
) -> None:
    runner = make_runner()
    ready = tmp_path / "ready"
    [iid] = cloud.launch(command=[sys.executable, "-c", IGNORES_SIGTERM], env={"READY_FILE": str(ready)})
    wait_for_file(runner, ready)
    runner.poll()  # sees the workload's own session and its child's

    started = time.monotonic()
    runner.stop_all(timeout=1)
    runner.stop_all(timeout=1)  # idempotent

    assert time.monotonic() - started < 10
    assert len(runner.process_groups()) >= 3
    assert_all_gone(runner)
    assert not runner.instances[iid].alive


@pytest.mark.timeout(180)
def test_two_nodes_rendezvous_on_this_host(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner], tmp_path: Path
) -> None:
    runner = make_runner()
    script = (
        "import json, os, sys; "
        "env = {k: v for k, v in os.environ.items() if k.startswith('GPUJOBS_')}; "
        "open(os.path.join(sys.argv[1], env['GPUJOBS_NODE_RANK']), 'w').write(json.dumps(env))"
    )
    ids = cloud.launch(command=[sys.executable, "-c", script, str(tmp_path)], count=2)

    poll_until(runner, lambda: all(runner.instances.get(i) and runner.instances[i].state == "terminated" for i in ids))

    rank0, rank1 = (json.loads((tmp_path / str(rank)).read_text()) for rank in (0, 1))
    assert rank0["GPUJOBS_MASTER_ADDR"] == rank1["GPUJOBS_MASTER_ADDR"] == "127.0.0.1"
    assert rank0["GPUJOBS_MASTER_PORT"] == rank1["GPUJOBS_MASTER_PORT"] != "29500"
    assert (rank0["GPUJOBS_INSTANCE_ID"], rank1["GPUJOBS_INSTANCE_ID"]) == tuple(ids)
    assert sorted(e["exit_code"] for e in cloud.exits()) == [0, 0]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_digits_example_trains_through_bootstrap_launcher_and_torchrun(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner]
) -> None:
    runner = make_runner(entrypoint=None, cwd=REPO)  # the real launcher
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    cloud.s3.create_bucket(Bucket=bucket)
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    [iid] = cloud.launch(
        command=[sys.executable, str(REPO / "training_image/examples/digits/train.py"), "--steps", "60"],
        job_id=job_id,
        gpus_per_node=2,
        checkpoint_uri=f"s3://{bucket}/jobs/{job_id}/ckpt",
        env={"GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS": "60", "PYTHONUNBUFFERED": "1"},
    )

    poll_until(
        runner, lambda: runner.instances.get(iid) is not None and runner.instances[iid].state == "terminated", 150
    )

    log = runner.log_path(iid).read_text()
    assert runner.instances[iid].exit_code == 0, log
    exits = [e for e in cloud.exits() if e.get("instance_id") == iid and "message" in e]  # the bootstrap's
    assert [e["exit_code"] for e in exits] == [0], log
    keys = [o["Key"] for o in cloud.s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert any(k.endswith("/COMMIT.json") for k in keys), keys
    assert "--nproc-per-node 2" in log


def test_a_job_with_its_own_role_hears_the_spot_notice_through_the_filtered_imds(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner], tmp_path: Path
) -> None:
    """The workload's IMDS is the bootstrap's filtered one: the notice arrives, the instance role does not."""
    runner = make_runner()
    out, ready = tmp_path / "notice", tmp_path / "ready"
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    [iid] = cloud.launch(
        command=[sys.executable, "-c", WATCHES_SPOT_NOTICE],
        env={"OUT_FILE": str(out), "READY_FILE": str(ready)},
        spot=True,
        job_id=job_id,
        job_role_arn=JOB_ROLE,
        credentials_function=FUNCTION,
        stack=STACK,
        session_policy=session_policy_json(bucket="unused", job_id=job_id, team="vision"),
        session_tags=session_tags(job_id=job_id, team="vision", attempt=1),
    )
    wait_for_file(runner, ready)

    runner.interrupt_spot(iid, notice_seconds=2.0)
    wait_for_file(runner, out, timeout=10)
    poll_until(runner, lambda: runner.instances[iid].state == "terminated", timeout=20)

    assert json.loads(out.read_text().splitlines()[0])["action"] == "terminate"
    log = runner.log_path(iid).read_text()
    assert "the workload gets the job role's credentials from http://127.0.0.1:" in log
    assert [e["exit_code"] for e in cloud.exits()] == [75]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "case",
    [
        ("local/gpujobs-train:dev", ["trian.sh", "--steps", "10"], 127, "trian.sh: command not found"),
        ("pytorch/pytorch:2.5", ["python", "train.py"], 125, "cannot run image 'pytorch/pytorch:2.5'"),
    ],
    ids=["misspelt-command", "unknown-image"],
)
def test_a_job_that_cannot_run_in_its_image_exits_as_docker_would_and_says_why(
    cloud: Cloud, make_runner: Callable[..., InstanceRunner], case: tuple[str, list[str], int, str]
) -> None:
    # given instances that run each job as its image would (the local cloud's runner)
    image, command, code, said = case
    runner = make_runner(images=True)

    # when a job names a program its image cannot find, or an image the local cloud cannot run
    [iid] = cloud.launch(image=image, command=command)
    poll_until(runner, lambda: runner.instances.get(iid) is not None and runner.instances[iid].state == "terminated")

    # then the bootstrap reports docker's exit code, and the line that says why, in its exit report
    [exited] = [e for e in cloud.exits() if e.get("instance_id") == iid and "message" in e]
    assert (exited["exit_code"], exited["reason"]) == (code, "exited")
    assert said in exited["message"], runner.log_path(iid).read_text()


CALLS_AWS_AS_THE_JOB = (
    "import boto3, json, os, platform, sys; "
    "arn = boto3.client('sts').get_caller_identity()['Arn']; "
    "json.dump({'python': platform.python_version(), 'arn': arn}, open(os.environ['OUT_FILE'], 'w'))"
)


@pytest.mark.timeout(180)
def test_the_bootstrap_runs_under_the_amis_python_and_the_workload_under_the_images(
    cloud: Cloud,
    make_runner: Callable[..., InstanceRunner],
    tmp_path: Path,
    old_python: BootstrapPython,
    credentials_function: tuple[str, GrantingCredentialsFunction],
) -> None:
    # given instances whose bootstrap runs with the AMI's python3 (an environment with only boto3)
    runner = make_runner(instance_python=old_python.path)
    out = tmp_path / "seen.json"
    job_id = f"job-{uuid.uuid4().hex[:8]}"

    # when a job with its own role runs a workload that calls AWS
    [iid] = cloud.launch(
        command=[sys.executable, "-c", CALLS_AWS_AS_THE_JOB],
        env={"OUT_FILE": str(out)},
        job_id=job_id,
        job_role_arn=JOB_ROLE,
        credentials_function=FUNCTION,
        stack=STACK,
        session_policy=session_policy_json(bucket="unused", job_id=job_id, team="vision"),
        session_tags=session_tags(job_id=job_id, team="vision", attempt=1),
    )
    poll_until(runner, lambda: runner.instances.get(iid) is not None and runner.instances[iid].state == "terminated")

    # then the bootstrap ran on that Python and served the job role; the workload kept the image's Python
    log = runner.log_path(iid).read_text()
    assert f"gpujobs-bootstrap: Python {old_python.version} at {old_python.path}" in log
    seen = json.loads(out.read_text())
    assert seen["python"] == platform.python_version()
    assert ":assumed-role/gpujobs-local-JobRole/" in seen["arn"], log
    assert [e["exit_code"] for e in cloud.exits()] == [0]
    # and it asked for the job's session as its own instance (its instance-role session, from its IMDS)
    _, function = credentials_function
    assert {(a["job_id"], a["attempt"]) for a in function.asks} == {(job_id, 1)}
    assert set(function.signers) == {f"arn:aws:sts::123456789012:assumed-role/{STACK}-InstanceRole/{iid}"}


def test_an_instance_python_that_cannot_run_the_bootstrap_is_refused_up_front(cloud: Cloud, tmp_path: Path) -> None:
    bare = str(find_interpreter("3.9"))  # pyenv's own 3.9: no boto3
    cases = {"/nonexistent/python3": "cannot be run", bare: "No module named 'boto3'"}

    for python, says in cases.items():
        with pytest.raises(ValueError, match=says) as refused:
            InstanceRunner(
                ec2=cloud.ec2, stack_name=STACK, emit=cloud.emit, workdir=tmp_path, env={}, instance_python=python
            )

        assert f"instance python {python!r}" in str(refused.value)


def test_a_rendezvous_port_is_below_the_ephemeral_range_and_skips_a_bound_one() -> None:
    """Outgoing connections take their source ports from the ephemeral range; a gang's rendezvous
    port picked there could be taken before torchrun binds it, and the trainer exited 1."""
    low, high = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    taken_port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken_port))
        other_port = free_port()
        picks = iter([taken_port, other_port])

        class Scripted(random.Random):
            def choice(self, seq: Any) -> Any:
                return next(picks)

        assert free_port(Scripted()) == other_port
    picked = [free_port() for _ in range(50)]
    assert all(port in RENDEZVOUS_PORTS and not low <= port <= high for port in picked)
