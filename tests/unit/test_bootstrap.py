"""The instance bootstrap, run as a plain process against a fake IMDSv2 and moto.

Stories: the workload gets the job's literal strings and the GPUJOBS_* contract, its exit code is
published as "Job Exited", a broken document is reported as a bootstrap failure, SIGTERM reaches the
workload, multi-node rendezvous finds rank 0's private IP, and a replacement attempt waits for the
interrupted one to end (its instances gone or its last checkpoint committed) before it starts.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.domain.rundoc import RunDocument
from gpujobs.instance import (
    bootstrap,
    cloudwatch_agent,
    contract,
    errors,
    handover,
    rendezvous,
    report,
    rundoc,
    runtimes,
)
from gpujobs.instance.userdata import (
    BOOTSTRAP_LOG,
    bootstrap_bundle,
    bootstrap_command,
    bootstrap_key,
    bootstrap_script,
    render_user_data,
    unpack_bootstrap,
)
from gpujobs.instance.workload_env import container_env
from tests.conftest import BootstrapPython
from tests.iam.recorder import RECORDER
from tests.unit.fake_imds import FakeImds

BUCKET = "gpujobs-test-checkpoints"
REGION = "us-east-1"
BOOTSTRAP = Path(bootstrap.__file__)
INSTANCE_ID = "i-0aaaabbbbccccdddd"
HOSTILE = [
    "$(touch /tmp/pwned)",
    "`id`",
    "it's",
    '"q"',
    "a;b",
    "x && y",
    "two\nlines",
    "GPUJOBS_BOOTSTRAP_EOF",
    "${HOME}",
    "caf\u00e9 \u2603",
]
TRICKY_ONE_LINE = "\t".join(h for h in HOSTILE if "\n" not in h)
"""HOSTILE as one env value docker can carry: its --env-file is line-based (the process runtime takes line breaks)."""
WORKLOAD = (
    "import json, os, sys; "
    "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open(os.environ['OUT_FILE'], 'w')); "
    "sys.exit(int(os.environ['EXIT_CODE']))"
)
WAITING_WORKLOAD = (
    "import os, signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    open(os.environ['OUT_FILE'], 'w').write(str(signum)); sys.exit(42)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "open(os.environ['READY_FILE'], 'w').close()\n"
    "time.sleep(30)\n"
)


class Bus:
    """A fresh event bus whose events land in an SQS queue we can read."""

    def __init__(self, endpoint: str) -> None:
        kwargs: dict[str, Any] = {
            "endpoint_url": endpoint,
            "region_name": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
        self.name = f"gpujobs-{uuid.uuid4().hex[:8]}"
        self.events, self.sqs = boto3.client("events", **kwargs), boto3.client("sqs", **kwargs)
        self.queue_url = self.sqs.create_queue(QueueName=self.name)["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])
        self.events.create_event_bus(Name=self.name)
        self.events.put_rule(
            Name="exits", EventBusName=self.name, EventPattern=json.dumps({"source": [contract.EVENT_SOURCE]})
        )
        self.events.put_targets(
            Rule="exits", EventBusName=self.name, Targets=[{"Id": "q", "Arn": arn["Attributes"]["QueueArn"]}]
        )

    def exits(self) -> list[dict[str, Any]]:
        messages = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10)
        events = [json.loads(m["Body"]) for m in messages.get("Messages", [])]
        assert all(e["detail-type"] == "Job Exited" for e in events)
        return [e["detail"] for e in events]


@pytest.fixture
def bus(moto_endpoint: str) -> Bus:
    return Bus(moto_endpoint)


def a_document(tmp_path: Path, bus: Bus, *, exit_code: int = 0, **changes: Any) -> RunDocument:
    fields: dict[str, Any] = {
        "job_id": "job-7",
        "attempt": 3,
        "name": "demo",
        "image": "unused-by-process-runtime",
        "command": [sys.executable, "-c", WORKLOAD, *HOSTILE],
        "env": {"OUT_FILE": str(tmp_path / "out.json"), "EXIT_CODE": str(exit_code), "TRICKY": "\n".join(HOSTILE)},
        "nodes": 1,
        "gpus_per_node": 0,
        "checkpoint_uri": "s3://bucket/jobs/job-7/ckpt",
        "resume_from_step": 40,
        "event_bus": bus.name,
        "region": "us-east-1",
        "stop_timeout_seconds": 5,
    }
    return RunDocument(**{**fields, **changes})


def a_fake_bin(tmp_path: Path) -> Path:
    """A PATH holding only a fake `shutdown` that records its arguments."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    shutdown = fake_bin / "shutdown"
    shutdown.write_text(
        f"#!{sys.executable}\nimport sys\nopen({str(tmp_path / 'shutdown')!r}, 'w').write(' '.join(sys.argv[1:]))\n"
    )
    shutdown.chmod(0o755)
    return fake_bin


def sigterm_once_it_prints(proc: subprocess.Popen[str], marker: str) -> str:
    """Read the bootstrap's output until `marker`, SIGTERM it, and return the rest of what it printed."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if marker in line:
            break
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    return output


def start_bootstrap(
    tmp_path: Path,
    imds: FakeImds,
    moto_endpoint: str,
    *args: str,
    python: str = sys.executable,
    lambda_endpoint: str | None = None,
) -> subprocess.Popen[str]:
    """The bundled bootstrap (the bytes the loader runs on an instance) as a process, under `python`.
    `lambda_endpoint`: where its Lambda client invokes the credentials function (`AWS_ENDPOINT_URL_LAMBDA`)."""
    env = {
        **({"AWS_ENDPOINT_URL_LAMBDA": lambda_endpoint} if lambda_endpoint else {}),
        "PATH": str(a_fake_bin(tmp_path)),
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
        "SECRET_OF_THE_HOST": "must-not-leak",
    }
    bundle = unpack_bootstrap(tmp_path / "bootstrap")
    return subprocess.Popen(
        [*bootstrap_command(python, bundle), "--runtime", "process", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_bootstrap(
    tmp_path: Path,
    imds: FakeImds,
    moto_endpoint: str,
    *args: str,
    python: str = sys.executable,
    lambda_endpoint: str | None = None,
) -> tuple[int, str]:
    proc = start_bootstrap(tmp_path, imds, moto_endpoint, *args, python=python, lambda_endpoint=lambda_endpoint)
    output, _ = proc.communicate(timeout=60)
    return proc.returncode, output


def test_the_workload_gets_literal_strings_and_the_gpujobs_contract(
    tmp_path: Path, bus: Bus, moto_endpoint: str, bootstrap_python: BootstrapPython
) -> None:
    doc = a_document(tmp_path, bus)
    with FakeImds(
        user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID, local_ipv4="10.1.2.3"
    ) as imds:
        code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown", python=bootstrap_python.path)

    assert code == 0, output
    assert f"gpujobs-bootstrap: Python {bootstrap_python.version} at " in output
    seen = json.loads((tmp_path / "out.json").read_text())
    assert seen["argv"] == HOSTILE
    assert seen["env"]["TRICKY"] == "\n".join(HOSTILE)
    assert {k: v for k, v in seen["env"].items() if k.startswith("GPUJOBS_")} == {
        "GPUJOBS_JOB_ID": "job-7",
        "GPUJOBS_ATTEMPT": "3",
        "GPUJOBS_NNODES": "1",
        "GPUJOBS_NODE_RANK": "0",
        "GPUJOBS_NPROC_PER_NODE": "1",
        "GPUJOBS_MASTER_ADDR": "10.1.2.3",
        "GPUJOBS_MASTER_PORT": "29500",
        "GPUJOBS_CHECKPOINT_URI": "s3://bucket/jobs/job-7/ckpt",
        "GPUJOBS_RESUME_FROM_STEP": "40",
        "GPUJOBS_CHECKPOINT_EVERY_MINUTES": "30",
        "GPUJOBS_CHECKPOINT_MODE": "gpujobs",
        "GPUJOBS_EVENT_BUS": bus.name,
        "GPUJOBS_INSTANCE_ID": INSTANCE_ID,
        "GPUJOBS_INSTANCE_TYPE": "g5.xlarge",  # no GPUJOBS_INTERCONNECT_FLOOR_GBS: a single node has no gang to measure
    }
    assert seen["env"]["AWS_REGION"] == seen["env"]["AWS_DEFAULT_REGION"] == "us-east-1"
    assert seen["env"]["AWS_ENDPOINT_URL"] == moto_endpoint
    assert "SECRET_OF_THE_HOST" not in seen["env"]
    assert not Path("/tmp/pwned").exists()
    assert imds.unauthorized_gets == 0
    assert bus.exits() == [
        {
            "job_id": "job-7",
            "attempt": 3,
            "node_rank": 0,
            "instance_id": INSTANCE_ID,
            "exit_code": 0,
            "reason": "exited",
            "message": "workload exited with 0",
        }
    ]
    assert not (tmp_path / "shutdown").exists()


def test_a_failing_workload_is_published_and_the_instance_shuts_down(
    tmp_path: Path, bus: Bus, moto_endpoint: str
) -> None:
    user_data = tmp_path / "user-data"
    user_data.write_bytes(render_user_data(a_document(tmp_path, bus, exit_code=3), bucket=BUCKET, region=REGION))
    with FakeImds(user_data=b"", instance_id=INSTANCE_ID) as imds:
        code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--user-data", str(user_data))

    assert code == 3, output
    [exited] = bus.exits()
    assert (exited["exit_code"], exited["reason"]) == (3, "exited")
    assert (tmp_path / "shutdown").read_text() == "-h now"


def fake_tool(fake_bin: Path, name: str, script: str) -> None:
    """A fake of a host tool on the bootstrap's PATH (what the local cloud uses to play a bad host)."""
    fake_bin.mkdir(exist_ok=True)
    tool = fake_bin / name
    tool.write_text(f"#!{sys.executable}\nimport os, sys\n{script}\n")
    tool.chmod(0o755)


def test_a_node_whose_gpus_fail_their_check_reports_unhealthy_and_never_runs_the_workload(
    tmp_path: Path, bus: Bus, moto_endpoint: str, bootstrap_python: BootstrapPython
) -> None:
    doc = a_document(tmp_path, bus, gpus_per_node=4, gpu_counts={"p4d.24xlarge": 8})
    fake_tool(tmp_path / "bin", "nvidia-smi", "print('0, 00000000:10:1C.0, 0, [N/A]')")
    with FakeImds(
        user_data=render_user_data(doc, bucket=BUCKET, region=REGION),
        instance_id=INSTANCE_ID,
        instance_type="p4d.24xlarge",
    ) as imds:
        code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown", python=bootstrap_python.path)

    assert code == contract.EXIT_UNHEALTHY_NODE, output
    assert not (tmp_path / "out.json").exists()  # the workload never started
    [exited] = bus.exits()
    assert (exited["exit_code"], exited["reason"], exited["instance_id"]) == (122, "unhealthy-node", INSTANCE_ID)
    assert exited["message"] == "GPU check failed on p4d.24xlarge: nvidia-smi sees 1 GPU(s), the type has 8"


def test_a_workload_that_fails_while_the_kernel_logs_a_hardware_xid_is_a_hardware_fault(
    tmp_path: Path, bus: Bus, moto_endpoint: str
) -> None:
    doc = a_document(tmp_path, bus, exit_code=3, gpus_per_node=1)
    fake_tool(tmp_path / "bin", "nvidia-smi", "print('0, 00000000:00:1E.0, 0, No')")
    xid = "[ 8210.339146] NVRM: Xid (PCI:0000:00:1e): 79, pid=1234, GPU has fallen off the bus."
    fake_tool(  # the XID appears once the workload has run (it wrote its output)
        tmp_path / "bin", "dmesg", f"print({xid!r}) if os.path.exists({str(tmp_path / 'out.json')!r}) else None"
    )
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown")

    assert code == contract.EXIT_HARDWARE_FAULT, output
    [exited] = bus.exits()
    assert (exited["exit_code"], exited["reason"]) == (121, "exited")
    assert exited["message"] == "workload exited with 3: hardware fault: XID 79 on PCI:0000:00:1e"


def test_without_nvidia_smi_a_gpu_job_on_the_local_cloud_has_no_gpus_to_check(
    tmp_path: Path, bus: Bus, moto_endpoint: str
) -> None:
    doc = a_document(tmp_path, bus, gpus_per_node=1)
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown")

    assert code == 0, output
    assert "GPU check: no GPUs to check (no nvidia-smi on this host)" in output


def test_a_workload_that_cannot_start_is_reported_with_the_line_that_says_why(
    tmp_path: Path, bus: Bus, moto_endpoint: str
) -> None:
    # given a workload that fails as a container whose program is missing does: a line, then 127
    says_why = 'print("starting", file=sys.stderr); print("exec: \\"trian.sh\\": not found", file=sys.stderr)'
    command = [sys.executable, "-c", f"import sys; {says_why}; sys.exit(127)"]
    user_data = tmp_path / "user-data"
    user_data.write_bytes(render_user_data(a_document(tmp_path, bus, command=command), bucket=BUCKET, region=REGION))
    with FakeImds(user_data=b"", instance_id=INSTANCE_ID) as imds:
        code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--user-data", str(user_data), "--no-shutdown")

    # then the exit report quotes its last line, and the bootstrap's log still holds all it printed
    assert code == 127, output
    [exited] = bus.exits()
    assert (exited["exit_code"], exited["reason"]) == (127, "exited")
    assert exited["message"] == 'workload exited with 127: exec: "trian.sh": not found'
    assert "starting" in output


def test_the_process_runtime_calls_an_engine_as_docker_run_is_called(tmp_path: Path) -> None:
    # given an engine (the local cloud's container program) that records how it was called
    record = f"import json, sys; json.dump(sys.argv[1:], open({str(tmp_path / 'argv.json')!r}, 'w'))"
    runtime = runtimes.ProcessRuntime(engine=[sys.executable, "-c", record, "--root", "/r"])
    doc = {"image": "registry/gpujobs-train:1", "command": ["python", "/opt/gpujobs/train.py"]}

    runtime.start(doc, {})

    # then it gets the image, then the command: ENGINE IMAGE COMMAND...
    assert runtime.wait() == 0
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv == ["--root", "/r", "registry/gpujobs-train:1", "python", "/opt/gpujobs/train.py"]


def test_a_broken_document_is_reported_as_a_bootstrap_failure(
    tmp_path: Path, bus: Bus, moto_endpoint: str, bootstrap_python: BootstrapPython
) -> None:
    broken = {**a_document(tmp_path, bus).model_dump(mode="json"), "command": "rm -rf / # a string, not a list"}
    with FakeImds(user_data=json.dumps(broken).encode(), instance_id=INSTANCE_ID) as imds:
        code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown", python=bootstrap_python.path)

    assert code == contract.EXIT_BOOTSTRAP_FAILED, output
    [exited] = bus.exits()
    assert exited["reason"] == "bootstrap-failed"
    assert exited["job_id"] == "job-7"
    assert exited["exit_code"] == contract.EXIT_BOOTSTRAP_FAILED
    assert "command" in exited["message"]
    assert not (tmp_path / "out.json").exists()


def test_sigterm_reaches_the_workload_and_its_exit_is_published(
    tmp_path: Path, bus: Bus, moto_endpoint: str, bootstrap_python: BootstrapPython
) -> None:
    ready = tmp_path / "ready"
    doc = a_document(
        tmp_path,
        bus,
        command=[sys.executable, "-c", WAITING_WORKLOAD],
        env={"OUT_FILE": str(tmp_path / "out"), "READY_FILE": str(ready)},
    )
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        proc = start_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown", python=bootstrap_python.path)
        deadline = time.monotonic() + 30
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)

    assert proc.returncode == 42, output
    assert (tmp_path / "out").read_text() == str(int(signal.SIGTERM))
    [exited] = bus.exits()
    assert exited["exit_code"] == 42
    assert "signal" in exited["message"]


def test_sigterm_while_waiting_for_peers_ends_the_bootstrap_at_once(
    tmp_path: Path, bus: Bus, moto_endpoint: str
) -> None:
    doc = a_document(tmp_path, bus, nodes=2)  # the other node never comes
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        proc = start_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown")
        output = sigterm_once_it_prints(proc, "job job-7 attempt 3")

    assert proc.returncode == 128 + signal.SIGTERM, output
    [exited] = bus.exits()
    assert exited["reason"] == "bootstrap-failed"
    assert "before the workload started" in exited["message"]


def test_publishing_failures_are_retried_and_never_raise() -> None:
    calls: list[int] = []

    def broken_client() -> Any:
        calls.append(1)
        raise ConnectionError("no route to EventBridge")

    published = report.publish_exit(broken_client, bus="b", detail={}, tries=3, backoff=0.0)

    assert published is False
    assert len(calls) == 3


# --- rendezvous --------------------------------------------------------------------------------


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    with mock_aws():
        yield boto3.client("ec2", region_name="us-east-1")


def launch(ec2: Any, *, count: int, job_id: str = "job-7", attempt: int = 3) -> list[dict[str, Any]]:
    tags = [{"Key": contract.TAG_JOB_ID, "Value": job_id}, {"Key": contract.TAG_ATTEMPT, "Value": str(attempt)}]
    reservation = ec2.run_instances(
        ImageId="ami-12c6146b",
        MinCount=count,
        MaxCount=count,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    instances: list[dict[str, Any]] = reservation["Instances"]
    return instances


def test_two_nodes_agree_on_rank_0s_private_ip_as_master(ec2: Any) -> None:
    instances = launch(ec2, count=2)
    launch(ec2, count=1, attempt=2)  # an older attempt of the same job
    launch(ec2, count=1, job_id="someone-else")
    by_index = {i["AmiLaunchIndex"]: i for i in instances}

    results = [
        rendezvous.rendezvous(
            ec2,
            job_id="job-7",
            attempt=3,
            nodes=2,
            instance_id=i["InstanceId"],
            own_ip=i["PrivateIpAddress"],
            timeout=5,
            poll=0.01,
        )
        for i in (by_index[1], by_index[0])
    ]

    master = by_index[0]["PrivateIpAddress"]
    assert results == [(1, master, 0), (0, master, 0)]


def test_ranks_stay_consistent_when_several_launches_made_the_nodes(ec2: Any) -> None:
    first, second = launch(ec2, count=1)[0], launch(ec2, count=1)[0]  # both have launch index 0

    ranks = {
        i["InstanceId"]: rendezvous.rendezvous(
            ec2,
            job_id="job-7",
            attempt=3,
            nodes=2,
            instance_id=i["InstanceId"],
            own_ip=i["PrivateIpAddress"],
            timeout=5,
            poll=0.01,
        )
        for i in (first, second)
    }

    assert sorted(place.rank for place in ranks.values()) == [0, 1]
    assert len({place.master for place in ranks.values()}) == 1


def regroup(ec2: Any, instances: list[dict[str, Any]], generation: int) -> None:
    """What the control plane does for a regroup: the survivors' generation raised."""
    ids = [i["InstanceId"] for i in instances]
    ec2.create_tags(Resources=ids, Tags=[{"Key": contract.TAG_GENERATION, "Value": str(generation)}])


def place_of(ec2: Any, instance: dict[str, Any], *, nodes: int = 2, timeout: float = 5) -> Any:
    return rendezvous.rendezvous(
        ec2,
        job_id="job-7",
        attempt=3,
        nodes=nodes,
        instance_id=instance["InstanceId"],
        own_ip=instance["PrivateIpAddress"],
        timeout=timeout,
        poll=0.01,
    )


def test_a_regrouped_gang_meets_its_replacement_and_never_the_node_that_is_going(ec2: Any) -> None:
    survivor, going = sorted(launch(ec2, count=2), key=lambda i: i["AmiLaunchIndex"])
    regroup(ec2, [survivor], 1)
    (replacement,) = launch(ec2, count=1)
    regroup(ec2, [replacement], 1)  # launched with the next generation's tag

    places = {i["InstanceId"]: place_of(ec2, i) for i in (survivor, replacement)}

    assert sorted(p.rank for p in places.values()) == [0, 1]  # two nodes, as before
    assert {p.generation for p in places.values()} == {1}
    assert len({p.master for p in places.values()}) == 1
    assert {p.master for p in places.values()} <= {survivor["PrivateIpAddress"], replacement["PrivateIpAddress"]}
    with pytest.raises(errors.BootstrapError, match="1 of 2 instances of generation 0"):
        place_of(ec2, going, timeout=0.05)  # alone in its generation: the reclaimed node never joins


def test_a_survivor_learns_that_its_gang_regroups_and_waits_no_longer_than_told(ec2: Any) -> None:
    survivor, _going = launch(ec2, count=2)
    iid = survivor["InstanceId"]

    assert rendezvous.wait_for_regroup(ec2, instance_id=iid, above=0, timeout=0.05, poll=0.01) is None
    regroup(ec2, [survivor], 1)
    assert rendezvous.wait_for_regroup(ec2, instance_id=iid, above=0, timeout=0.05, poll=0.01) == 1
    assert rendezvous.wait_for_regroup(ec2, instance_id=iid, above=1, timeout=0.05, poll=0.01) is None


def test_rendezvous_gives_up_when_a_node_never_appears(ec2: Any) -> None:
    [only] = launch(ec2, count=1)

    with pytest.raises(errors.BootstrapError, match="1 of 2"):
        rendezvous.rendezvous(
            ec2,
            job_id="job-7",
            attempt=3,
            nodes=2,
            instance_id=only["InstanceId"],
            own_ip=only["PrivateIpAddress"],
            timeout=0.05,
            poll=0.01,
        )


def test_a_single_node_is_its_own_master() -> None:
    assert rendezvous.rendezvous(None, job_id="j", attempt=1, nodes=1, instance_id="i", own_ip="10.0.0.9") == (
        0,
        "10.0.0.9",
        0,
    )


def test_the_local_cloud_can_override_the_master_address_and_port(tmp_path: Path, bus: Bus, moto_endpoint: str) -> None:
    """On one host the rank-0 private IP (moto's 10.x) is unreachable and every job asks for 29500."""
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    ec2 = boto3.client(
        "ec2",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    instances = {i["AmiLaunchIndex"]: i for i in launch(ec2, count=2, job_id=job_id)}
    doc = a_document(tmp_path, bus, job_id=job_id, nodes=2)
    imds = FakeImds(
        user_data=render_user_data(doc, bucket=BUCKET, region=REGION),
        instance_id=instances[1]["InstanceId"],
        launch_index=1,
        local_ipv4=instances[1]["PrivateIpAddress"],
    )
    with imds:
        code, output = run_bootstrap(
            tmp_path, imds, moto_endpoint, "--no-shutdown", "--master-addr", "127.0.0.1", "--master-port", "31234"
        )

    assert code == 0, output
    env = json.loads((tmp_path / "out.json").read_text())["env"]
    assert (env["GPUJOBS_NODE_RANK"], env["GPUJOBS_NNODES"]) == ("1", "2")
    assert (env["GPUJOBS_MASTER_ADDR"], env["GPUJOBS_MASTER_PORT"]) == ("127.0.0.1", "31234")


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_a_master_port_override_must_be_a_tcp_port(port: str) -> None:
    with pytest.raises(SystemExit):
        bootstrap._parse_args(["--master-port", port])


def test_without_overrides_the_rendezvous_address_and_document_port_are_used() -> None:
    args = bootstrap._parse_args([])
    assert (args.master_addr, args.master_port) == ("", None)


# --- a replacement waits for the interrupted attempt -------------------------------------------


def in_background(target: Any) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(target()), daemon=True)
    thread.start()
    return thread, result


def test_a_replacement_waits_while_the_interrupted_attempt_runs_and_goes_once_it_is_gone(ec2: Any) -> None:
    [old] = launch(ec2, count=1, attempt=2)
    launch(ec2, count=1, attempt=3)  # the replacement itself does not count

    waiting, result = in_background(
        lambda: handover.wait_for_attempt(ec2, job_id="job-7", attempt=2, timeout=30, poll=0.01)
    )
    time.sleep(0.3)
    still_waiting = waiting.is_alive()
    ec2.terminate_instances(InstanceIds=[old["InstanceId"]])
    waiting.join(timeout=10)

    assert still_waiting
    assert result == ["attempt 2 has no instances left"]


def test_a_replacement_starts_anyway_when_the_interrupted_attempt_outlives_the_timeout(ec2: Any) -> None:
    [old] = launch(ec2, count=1, attempt=2)

    started = time.monotonic()
    ended = handover.wait_for_attempt(ec2, job_id="job-7", attempt=2, timeout=0.2, poll=0.05)

    assert 0.2 <= time.monotonic() - started < 5
    assert ended == f"attempt 2 still has instances {[old['InstanceId']]} after 0s; starting anyway"


def put_checkpoint(s3: Any, step: int, *, attempt: int, reason: str | None) -> None:
    """A step folder as the trainer leaves it (docs/training.md); reason None = a save cut short."""
    folder = f"jobs/job-7/ckpt/step-{step:08d}"
    s3.put_object(Bucket="ckpt", Key=f"{folder}/__0_0.distcp", Body=b"shard")
    if reason is not None:
        marker = {
            "step": step,
            "world_size": 2,
            "torch_version": "2.13.0",
            "reason": reason,
            "files": [{"name": "__0_0.distcp", "size": 5}],
            "time": "2026-11-29T12:00:00Z",
            "position": {"epoch": 1, "offset": 7},
            "job_id": "job-7",
            "attempt": attempt,
        }
        s3.put_object(Bucket="ckpt", Key=f"{folder}/COMMIT.json", Body=json.dumps(marker).encode())


JOB_CLIENT = (
    "a deployed bootstrap reads the interrupted attempt's commits with the job's credentials (job_clients),"
    " whose session policy lets it read the job's own checkpoints, as the trainer's resume does"
)


def test_the_wait_ends_once_the_interrupted_attempt_committed_its_preemption_checkpoint(ec2: Any) -> None:
    launch(ec2, count=1, attempt=2)  # still shutting down after its save
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    put_checkpoint(s3, 40, attempt=1, reason="preempted")  # what the replacement was told to resume from
    put_checkpoint(s3, 60, attempt=2, reason="periodic")  # the old attempt may still save again

    def committed() -> int | None:
        with RECORDER.unattributed(JOB_CLIENT):
            return handover.last_commit_by(s3, uri="s3://ckpt/jobs/job-7/ckpt", attempt=2, after_step=40)

    assert committed() is None
    waiting, result = in_background(
        lambda: handover.wait_for_attempt(ec2, job_id="job-7", attempt=2, timeout=30, poll=0.01, committed=committed)
    )
    put_checkpoint(s3, 90, attempt=2, reason=None)  # a later save cut short does not count
    put_checkpoint(s3, 75, attempt=2, reason="preempted")
    waiting.join(timeout=10)

    assert result == ["attempt 2 committed its last checkpoint, step 75"]


def test_only_a_newer_commit_by_the_interrupted_attempt_ends_the_wait(ec2: Any) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    put_checkpoint(s3, 40, attempt=2, reason="preempted")

    def newest(**changes: Any) -> int | None:
        asked: dict[str, Any] = {"uri": "s3://ckpt/jobs/job-7/ckpt", "attempt": 2, "after_step": None, **changes}
        with RECORDER.unattributed(JOB_CLIENT):
            return handover.last_commit_by(s3, **asked)

    assert newest() == 40
    assert newest(after_step=40) is None  # already known to the control plane: not this attempt's last words
    assert newest(attempt=3) is None
    assert newest(uri="s3://ckpt/jobs/other/ckpt") is None
    assert newest(uri="/local/path") is None  # only S3 is read; the wait then relies on the instances


def server_client(endpoint: str, service: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_a_replacement_waits_before_starting_its_workload_and_starts_after_the_timeout(
    tmp_path: Path, bus: Bus, moto_endpoint: str, bootstrap_python: BootstrapPython
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:6]}"
    old = server_client(moto_endpoint, "ec2").run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": contract.TAG_JOB_ID, "Value": job_id}, {"Key": contract.TAG_ATTEMPT, "Value": "2"}],
            }
        ],
    )["Instances"][0]
    doc = a_document(tmp_path, bus, job_id=job_id, wait_for_attempt=2)
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        code, output = run_bootstrap(
            tmp_path, imds, moto_endpoint, "--no-shutdown", "--wait-timeout", "0.5", python=bootstrap_python.path
        )

    assert code == 0, output
    assert json.loads((tmp_path / "out.json").read_text())["argv"] == HOSTILE
    waited = output.index("waiting up to 0s for attempt 2 to end")
    gave_up = output.index(f"attempt 2 still has instances ['{old['InstanceId']}']")
    assert waited < gave_up < output.index("starting the workload")
    assert [e["exit_code"] for e in bus.exits()] == [0]


def test_sigterm_while_waiting_for_the_interrupted_attempt_ends_the_bootstrap_at_once(
    tmp_path: Path, bus: Bus, moto_endpoint: str
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:6]}"
    server_client(moto_endpoint, "ec2").run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": contract.TAG_JOB_ID, "Value": job_id}, {"Key": contract.TAG_ATTEMPT, "Value": "2"}],
            }
        ],
    )
    doc = a_document(tmp_path, bus, job_id=job_id, wait_for_attempt=2)
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        proc = start_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown")
        output = sigterm_once_it_prints(proc, "waiting up to 240s for attempt 2")

    assert proc.returncode == 128 + signal.SIGTERM, output
    assert not (tmp_path / "out.json").exists()
    [exited] = bus.exits()
    assert exited["reason"] == "bootstrap-failed"
    assert "before the workload started" in exited["message"]


def test_a_document_cannot_wait_for_its_own_or_a_later_attempt() -> None:
    doc = {
        "job_id": "j",
        "attempt": 3,
        "name": "n",
        "image": "img",
        "command": ["python"],
        "checkpoint_uri": "s3://b/k",
    }

    assert rundoc.check_document({**doc, "wait_for_attempt": 2})["wait_for_attempt"] == 2
    with pytest.raises(errors.BootstrapError, match="wait_for_attempt 3 is not an earlier attempt"):
        rundoc.check_document({**doc, "wait_for_attempt": 3})


def test_a_document_whose_interconnect_floors_are_not_gb_per_second_by_type_is_refused() -> None:
    doc = {
        "job_id": "j",
        "attempt": 1,
        "name": "n",
        "image": "img",
        "command": ["python"],
        "checkpoint_uri": "s3://b/k",
    }

    assert rundoc.check_document({**doc, "interconnect_floors": {"p4d.24xlarge": 12.5}})["interconnect_floors"] == {
        "p4d.24xlarge": 12.5
    }
    assert rundoc.check_document(doc)["interconnect_floors"] == {}
    for bad in ({"p4d.24xlarge": "12.5"}, {"p4d.24xlarge": -1}, {"p4d.24xlarge": True}):
        with pytest.raises(errors.BootstrapError, match="interconnect_floors must map instance type names to GB/s"):
            rundoc.check_document({**doc, "interconnect_floors": bad})


# --- docker runtime (a fake docker CLI) --------------------------------------------------------

FAKE_DOCKER = """import json, os, sys
argv = sys.argv[1:]
if sys.argv[1:3] == ["image", "inspect"]:
    sys.exit("Error: No such image")  # not on the host: it is pulled
env_file = argv[argv.index("--env-file") + 1] if "--env-file" in argv else ""
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"argv": argv, "stdin": sys.stdin.read() if argv[0] == "login" else "",
                          "env": {k: v for k, v in os.environ.items() if k in ("GODEBUG", "GPUJOBS_JOB_ID")},
                          "env_file": open(env_file).read() if env_file else ""}) + "\\n")
"""


def test_docker_gets_the_workload_env_only_through_its_env_file_never_its_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(0o755)
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "calls.jsonl"))
    doc = rundoc.check_document(
        {
            "job_id": "job/7",
            "attempt": 3,
            "name": "n",
            "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
            "command": ["torchrun", "$(id)"],
            "env": {"GODEBUG": "http2debug=2"},
            "gpus_per_node": 8,
            "checkpoint_uri": "s3://b/k",
            "stop_timeout_seconds": 90,
        }
    )
    token = base64.b64encode(b"AWS:ecr-password").decode()

    class FakeEcr:
        def get_authorization_token(self, **kwargs: Any) -> dict[str, Any]:
            assert kwargs == {"registryIds": ["123456789012"]}
            return {"authorizationData": [{"authorizationToken": token}]}

    runtime = runtimes.DockerRuntime(str(docker))
    runtime.prepare(doc, lambda service: FakeEcr())
    runtime.start(doc, {"GODEBUG": "http2debug=2", "GPUJOBS_JOB_ID": "job/7"})
    assert runtime.wait() == 0

    login, pull, run = (json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines())
    assert login["argv"] == [
        "login",
        "--username",
        "AWS",
        "--password-stdin",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com",
    ]
    assert login["stdin"] == "ecr-password"
    assert pull["argv"] == ["pull", doc["image"]]
    env_file = run["argv"][run["argv"].index("--env-file") + 1]
    assert run["argv"] == [
        "run",
        "--rm",
        "--name",
        "gpujobs-job-7-a3",
        "--gpus",
        "all",
        "--network",
        "host",
        "--ipc",
        "host",
        "--stop-timeout",
        "90",
        "--user",
        "10001:10001",
        "--security-opt",
        "no-new-privileges",
        "--cap-drop",
        "ALL",
        "--pids-limit",
        "65536",
        "--env-file",
        env_file,
        doc["image"],
        "torchrun",
        "$(id)",
    ]
    # The job's GODEBUG reaches the container, never the root docker client's own Go runtime
    assert run["env_file"] == "GODEBUG=http2debug=2\nGPUJOBS_JOB_ID=job/7\n"
    assert run["env"] == {}
    assert "http2debug" not in json.dumps([login["argv"], pull["argv"], run["argv"]])


WHOLE_ENV_DOCKER = """import json, os, sys
argv = sys.argv[1:]
env_file = argv[argv.index("--env-file") + 1] if "--env-file" in argv else ""
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"argv": argv, "env": dict(os.environ), "env_file": open(env_file).read() if env_file else ""}))
"""

STEERING_ENV = {
    "GODEBUG": "http2debug=2",
    "GOTRACEBACK": "crash",
    "LD_PRELOAD": "/tmp/evil.so",
    "LD_LIBRARY_PATH": "/tmp/evil",
    "HTTPS_PROXY": "http://attacker.example:3128",
    "SSL_CERT_FILE": "/tmp/attacker-ca.pem",
    "PATH": "/tmp/evil-bin",
    "HOME": "/tmp/evil-home",
}
"""What would steer the root docker client (its Go runtime, its loader, its TLS, its config and
plugins under HOME, the helpers it finds on PATH) were it in the client's own environment."""


def test_a_job_env_that_would_steer_the_docker_client_reaches_only_the_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{WHOLE_ENV_DOCKER}")
    docker.chmod(0o755)
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "run.json"))
    doc = rundoc.check_document(
        {
            "job_id": "job-7",
            "attempt": 1,
            "name": "n",
            "image": "img:1",
            "command": ["python", "train.py"],
            "env": STEERING_ENV,
            "checkpoint_uri": "s3://b/k",
        }
    )
    env = container_env(doc, rank=0, master_addr="10.0.0.1", instance_id=INSTANCE_ID, region=REGION)
    bootstraps_env = dict(os.environ)

    runtime = runtimes.DockerRuntime(str(docker))
    runtime.start(doc, env)
    assert runtime.wait() == 0

    run = json.loads((tmp_path / "run.json").read_text())
    assert run["env"] == bootstraps_env, "the docker client runs with the bootstrap's environment, nothing of the job's"
    shipped = dict(line.split("=", 1) for line in run["env_file"].splitlines())
    assert {name: shipped[name] for name in STEERING_ENV} == STEERING_ENV
    assert not any(value in json.dumps(run["argv"]) for value in STEERING_ENV.values())


def test_a_run_document_cannot_name_a_docker_client_variable() -> None:
    doc = {
        "job_id": "j",
        "attempt": 1,
        "name": "n",
        "image": "img:1",
        "command": ["python"],
        "checkpoint_uri": "s3://b/k",
    }

    with pytest.raises(errors.BootstrapError, match="'DOCKER_HOST' is not allowed"):
        rundoc.check_document({**doc, "env": {"DOCKER_HOST": "tcp://attacker.example:2375"}})


def test_an_env_value_with_a_line_break_is_refused_naming_it_before_the_pull(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(0o755)
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "calls.jsonl"))
    fields = {"job_id": "j", "attempt": 1, "name": "n", "image": "i:1", "command": ["c"], "checkpoint_uri": "s3://b/k"}
    doc = rundoc.check_document({**fields, "env": {"MULTI": "a\nb", "ONE": "line"}})

    with pytest.raises(errors.BootstrapError, match=r"^MULTI: a line break cannot travel in docker's --env-file"):
        runtimes.DockerRuntime(str(docker)).prepare(doc, lambda service: None)
    assert not (tmp_path / "calls.jsonl").exists()  # neither pulled nor run


def test_the_cloudwatch_agent_publishes_a_per_instance_gpu_series() -> None:
    metrics = cloudwatch_agent.cloudwatch_agent_config()["metrics"]

    assert metrics["namespace"] == "CWAgent"
    assert metrics["aggregation_dimensions"] == [["InstanceId"]]
    assert metrics["append_dimensions"] == {"InstanceId": "${aws:InstanceId}"}
    assert metrics["metrics_collected"]["nvidia_gpu"] == {
        "measurement": ["utilization_gpu", "utilization_memory", "memory_used"],
        "metrics_collection_interval": 60,
    }


def test_the_bootstrap_explains_itself() -> None:
    done = subprocess.run(
        [sys.executable, str(BOOTSTRAP), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.defpath},
        check=True,
    )

    assert "--user-data" in done.stdout
    assert "fixed program" in done.stdout or "same bytes" in done.stdout


CONTAINERLESS_DOCKER = """import os, sys
args = sys.argv[1:]
if args[0] != "run":
    sys.exit(0)
env, i = {}, 1
while args[i].startswith("-"):
    if args[i] == "--env-file":  # docker's format: NAME=value per line, the value as it is
        env.update(line.split("=", 1) for line in open(args[i + 1]).read().split("\\n") if line)
    i += 1 if args[i] == "--rm" else 2
command = args[i + 1:]
os.execve(command[0], command, env)
"""


def store_bootstrap(endpoint: str, body: bytes) -> None:
    """What the launcher does before its first launch: the bundle at its key in the stack's bucket."""
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=bootstrap_key(), Body=body)


def run_the_shell_part(
    tmp_path: Path, moto_endpoint: str, doc: RunDocument, python: str = sys.executable, **extra_env: str
) -> tuple[int, Path]:
    """cloud-init's view: the shell part alone, default (docker) runtime, a docker that runs no container.
    `python` is the AMI's `python3`: the one with boto3 that the shell part finds on PATH."""
    script = tmp_path / "part-001.sh"
    log = tmp_path / "bootstrap.log"
    script.write_text(bootstrap_script(bucket=BUCKET, region=REGION).replace(BOOTSTRAP_LOG, str(log)))
    python_bin = str(Path(python).parent)
    fake_bin = tmp_path / "bin" if (tmp_path / "bin").exists() else a_fake_bin(tmp_path)
    (fake_bin / "docker").write_text(f"#!{sys.executable}\n{CONTAINERLESS_DOCKER}")
    (fake_bin / "docker").chmod(0o755)
    env = {
        "PATH": f"{fake_bin}:{python_bin}:/usr/bin:/bin",
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        **extra_env,
    }
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.endpoint
        done = subprocess.run(["bash", str(script)], env=env, timeout=60, check=False)
    return done.returncode, log


def test_bash_runs_the_user_data_shell_part_as_is(
    tmp_path: Path, bus: Bus, moto_endpoint: str, bootstrap_python: BootstrapPython
) -> None:
    """The loader fetches the stored bootstrap, checks it and runs it: the job's exit is reported."""
    store_bootstrap(moto_endpoint, bootstrap_bundle())
    doc = a_document(tmp_path, bus, exit_code=5)
    doc = doc.model_copy(update={"env": {**doc.env, "TRICKY": TRICKY_ONE_LINE}})

    returncode, log = run_the_shell_part(tmp_path, moto_endpoint, doc, python=bootstrap_python.path)

    assert returncode == 5, log.read_text()
    assert f"gpujobs-bootstrap: Python {bootstrap_python.version} at " in log.read_text()
    seen = json.loads((tmp_path / "out.json").read_text())
    assert seen["argv"] == HOSTILE
    assert seen["env"]["TRICKY"] == TRICKY_ONE_LINE
    assert seen["env"]["GPUJOBS_INSTANCE_ID"] == INSTANCE_ID
    assert [e["exit_code"] for e in bus.exits()] == [5]
    assert (tmp_path / "shutdown").read_text() == "-h now"


FAILING_DNF = """import json, os, sys
open(os.environ["DNF_CALLS"], "a").write(json.dumps(sys.argv[1:]) + "\\n")
print("Error: Failed to download metadata for repo 'amazonlinux'", file=sys.stderr)
sys.exit(1)
"""


def test_a_gpu_job_whose_cloudwatch_agent_cannot_be_installed_runs_and_reports_idle_detection_off(
    tmp_path: Path, bus: Bus, moto_endpoint: str, old_python: BootstrapPython
) -> None:
    # given an AMI without the CloudWatch agent whose dnf cannot reach its repository (a GPU job, docker)
    assert not Path(cloudwatch_agent.CW_AGENT_CTL).exists()
    store_bootstrap(moto_endpoint, bootstrap_bundle())
    dnf = a_fake_bin(tmp_path) / "dnf"
    dnf.write_text(f"#!{sys.executable}\n{FAILING_DNF}")
    dnf.chmod(0o755)
    doc = a_document(tmp_path, bus, exit_code=0, gpus_per_node=1)
    doc = doc.model_copy(update={"env": {**doc.env, "TRICKY": TRICKY_ONE_LINE}})  # docker's --env-file is line-based

    returncode, log = run_the_shell_part(
        tmp_path, moto_endpoint, doc, python=old_python.path, DNF_CALLS=str(tmp_path / "dnf.calls")
    )

    # then the job still ran, the bootstrap tried to install the agent, and said loudly that it could not
    assert returncode == 0, log.read_text()
    assert (tmp_path / "dnf.calls").read_text() == '["install", "-y", "amazon-cloudwatch-agent"]\n'
    why = "unavailable: dnf install amazon-cloudwatch-agent failed (1): Error: Failed to download metadata for repo"
    assert f"IDLE DETECTION IS OFF for this instance: the CloudWatch agent is {why}" in log.read_text()
    [exited] = bus.exits()
    assert (exited["exit_code"], exited["reason"]) == (0, "exited")
    assert exited["gpu_metrics"].startswith(why)


def test_the_loader_refuses_a_bootstrap_swapped_in_s3_and_powers_off(
    tmp_path: Path, bus: Bus, moto_endpoint: str
) -> None:
    """Whoever can write the bucket cannot run code on instances: user data pins the bundle's SHA-256."""
    modules = json.loads(gzip.decompress(bootstrap_bundle()))
    modules["gpujobs/instance/bootstrap.py"] += f"\nopen({str(tmp_path / 'pwned')!r}, 'w').close()\n"
    store_bootstrap(moto_endpoint, gzip.compress(json.dumps(modules).encode()))
    doc = a_document(tmp_path, bus, exit_code=5)

    returncode, log = run_the_shell_part(tmp_path, moto_endpoint, doc)

    assert returncode == contract.EXIT_BOOTSTRAP_FAILED
    assert "refused" in log.read_text()
    assert not (tmp_path / "out.json").exists()
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / "shutdown").read_text() == "-h now"


def test_nccl_and_gloo_are_told_the_interface_that_holds_the_instances_private_ip(
    tmp_path: Path, bus: Bus, moto_endpoint: str
) -> None:
    # given an instance whose private IP (IMDS local-ipv4) is held by this host's loopback
    doc = a_document(tmp_path, bus)
    with FakeImds(
        user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID, local_ipv4="127.0.0.1"
    ) as imds:
        code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown")

    # then the workload is told to bind that interface, not whichever gloo would pick (docker0)
    assert code == 0, output
    seen = json.loads((tmp_path / "out.json").read_text())
    assert seen["env"]["NCCL_SOCKET_IFNAME"] == seen["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert "NCCL and gloo use lo, which holds 127.0.0.1" in output
