"""On the instance, a job reaches only what is its own: its role's credentials, its secrets, its run document.

Attacks, each of which worked before: the container reading the instance role (IMDS, or the
bootstrap's own keys passed through), a secret value landing in user data, logs, events or S3, and a
run document swapped in S3 after launch. The bootstrap runs as a process against a moto server
(STS, Secrets Manager, SSM, S3, EventBridge), as on the local cloud; moto does not enforce the
session policy, which `tests/integration/test_job_isolation_policies.py` checks on the documents.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.credentials import ContainerProvider

from gpujobs.domain.job_access import session_policy_json, session_tags
from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.instance import errors, runtimes
from gpujobs.instance.contract import EXIT_BOOTSTRAP_FAILED
from gpujobs.instance.credentials import JobCredentials
from gpujobs.instance.hostagent import HostAgent
from gpujobs.instance.imds import Imds
from gpujobs.instance.userdata import render_user_data
from tests.conftest import BootstrapPython
from tests.granting_credentials_function import granting_credentials_function
from tests.unit.fake_imds import FakeImds
from tests.unit.test_bootstrap import (  # the bootstrap's own fixtures: a moto server and an event bus
    BOOTSTRAP,
    INSTANCE_ID,
    Bus,
    a_document,
    bus,
    run_bootstrap,
)

__all__ = ["bus"]  # fixtures, re-exported for pytest

BUCKET = "gpujobs-test-checkpoints"
REGION = "us-east-1"
HF_TOKEN = "hf_value_that_must_stay_on_the_instance_1234"
WANDB_KEY = "wandb-value-that-must-stay-on-the-instance-5678"
JOB_ROLE = "arn:aws:iam::123456789012:role/gpujobs-test-JobRole"
WORKLOAD = (
    "import json, os, boto3; "
    "arn = boto3.client('sts', region_name='us-east-1').get_caller_identity()['Arn']; "
    "json.dump({'env': dict(os.environ), 'arn': arn}, open(os.environ['OUT_FILE'], 'w'))"
)


def moto(endpoint: str, service: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def job_access(job_id: str = "job-7", team: str = "vision", attempt: int = 3) -> dict[str, Any]:
    return {
        "job_role_arn": JOB_ROLE,
        "credentials_function": "gpujobs-CredentialsFunction",
        "stack": "gpujobs",
        "session_policy": session_policy_json(bucket="bucket", job_id=job_id, team=team),
        "session_tags": session_tags(job_id=job_id, team=team, attempt=attempt),
    }


# ---- per-job credentials and secrets, end to end ----------------------------------------------
@pytest.fixture
def credentials_function(moto_endpoint: str) -> Iterator[str]:
    """The Lambda endpoint (`AWS_ENDPOINT_URL_LAMBDA`) of a credentials function granting the job role."""
    with granting_credentials_function(moto_endpoint, role_arn=JOB_ROLE) as (endpoint, _function):
        yield endpoint


@pytest.fixture(scope="module")
def secret_refs(moto_endpoint: str) -> dict[str, str]:
    arn = moto(moto_endpoint, "secretsmanager").create_secret(Name="gpujobs/vision/hf", SecretString=HF_TOKEN)["ARN"]
    moto(moto_endpoint, "ssm").put_parameter(Name="/gpujobs/vision/wandb", Value=WANDB_KEY, Type="SecureString")
    return {"HF_TOKEN": arn, "WANDB_API_KEY": "ssm:/gpujobs/vision/wandb"}


@pytest.fixture
def ran_with_secrets(
    *,
    tmp_path: Path,
    bus: Bus,
    moto_endpoint: str,
    secret_refs: dict[str, str],
    bootstrap_python: BootstrapPython,
    credentials_function: str,
) -> tuple[dict[str, Any], str, bytes]:
    """The bootstrap under each interpreter (this one, then the AMIs' 3.9 and 3.10) serving the job role."""
    doc = a_document(tmp_path, bus, command=[sys.executable, "-c", WORKLOAD], secrets=secret_refs, **job_access())
    user_data = render_user_data(doc, bucket=BUCKET, region=REGION)
    with FakeImds(user_data=user_data, instance_id=INSTANCE_ID) as imds:
        code, output = run_bootstrap(
            tmp_path,
            imds,
            moto_endpoint,
            "--no-shutdown",
            python=bootstrap_python.path,
            lambda_endpoint=credentials_function,
        )
    assert code == 0, output
    assert f"gpujobs-bootstrap: Python {bootstrap_python.version} at " in output
    return json.loads((tmp_path / "out.json").read_text()), output, user_data


def test_the_workload_acts_as_the_job_role_and_never_gets_the_instances_keys(
    ran_with_secrets: tuple[dict[str, Any], str, bytes],
) -> None:
    seen, _, _ = ran_with_secrets

    assert ":assumed-role/gpujobs-test-JobRole/gpujobs-job-7-a3" in seen["arn"]
    env = seen["env"]
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)
    assert env["AWS_CONTAINER_CREDENTIALS_FULL_URI"].startswith("http://127.0.0.1:")
    assert env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] != os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
    assert env["AWS_EC2_METADATA_DISABLED"] == "true"


def test_secrets_reach_the_workload_and_nowhere_else(
    ran_with_secrets: tuple[dict[str, Any], str, bytes], bus: Bus, moto_endpoint: str
) -> None:
    seen, output, user_data = ran_with_secrets

    # The workload has the values ...
    assert seen["env"]["HF_TOKEN"] == HF_TOKEN
    assert seen["env"]["WANDB_API_KEY"] == WANDB_KEY
    # ... and neither the user data, the bootstrap's log, the exit event nor any S3 object holds one
    s3 = moto(moto_endpoint, "s3")
    stored = b"".join(
        s3.get_object(Bucket=b["Name"], Key=o["Key"])["Body"].read()
        for b in s3.list_buckets()["Buckets"]
        for o in s3.list_objects_v2(Bucket=b["Name"]).get("Contents", [])
    )
    events = json.dumps(bus.exits())
    for value in (HF_TOKEN, WANDB_KEY):
        assert value.encode() not in user_data
        assert value.encode() not in stored
        assert value not in output
        assert value not in events


def test_a_secret_the_job_cannot_read_fails_the_bootstrap_naming_it_without_a_value(
    tmp_path: Path, bus: Bus, moto_endpoint: str, credentials_function: str
) -> None:
    doc = a_document(tmp_path, bus, secrets={"MISSING": "ssm:/gpujobs/vision/nope"}, **job_access())
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        code, _output = run_bootstrap(
            tmp_path, imds, moto_endpoint, "--no-shutdown", lambda_endpoint=credentials_function
        )

    (exited,) = bus.exits()
    assert code == exited["exit_code"] == EXIT_BOOTSTRAP_FAILED
    assert exited["reason"] == "bootstrap-failed"
    assert "cannot read secret MISSING from ssm:/gpujobs/vision/nope" in exited["message"]
    assert not (tmp_path / "out.json").exists()


# ---- run documents in S3 ------------------------------------------------------------------------
def test_a_run_document_swapped_in_s3_after_launch_is_refused(
    tmp_path: Path, bus: Bus, moto_endpoint: str, bootstrap_python: BootstrapPython
) -> None:
    # Given a document the launcher stored in S3, and user data pointing at it with its digest
    s3 = moto(moto_endpoint, "s3")
    s3.create_bucket(Bucket="rundocs")
    key = "jobs/job-7/attempt-3/run.json"
    body = a_document(tmp_path, bus).model_dump_json().encode()
    s3.put_object(Bucket="rundocs", Key=key, Body=body)
    pointer = RunDocumentPointer.for_stored(f"s3://rundocs/{key}", body)
    # When someone replaces the object before the instance boots
    swapped = a_document(tmp_path, bus, command=[sys.executable, "-c", "open('/tmp/pwned', 'w')"])
    s3.put_object(Bucket="rundocs", Key=key, Body=swapped.model_dump_json().encode())
    with FakeImds(user_data=render_user_data(pointer, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        code, _output = run_bootstrap(
            tmp_path, imds, moto_endpoint, "--no-shutdown", "--event-bus", bus.name, python=bootstrap_python.path
        )

    # Then the bootstrap refuses it, says why, and runs nothing
    (exited,) = bus.exits()
    assert code == exited["exit_code"] == EXIT_BOOTSTRAP_FAILED
    assert exited["reason"] == "bootstrap-failed"
    assert "SHA-256" in exited["message"]
    assert "refused" in exited["message"]
    assert not (tmp_path / "out.json").exists()


def test_a_refused_run_document_is_still_reported_as_its_attempts_exit(
    tmp_path: Path, bus: Bus, moto_endpoint: str
) -> None:
    # Given user data pointing at a stored document, saying whom to report to (as the launcher writes it)
    s3 = moto(moto_endpoint, "s3")
    s3.create_bucket(Bucket="rundocs")
    key = "jobs/job-7/attempt-3/run.json"
    original = a_document(tmp_path, bus)
    body = original.model_dump_json().encode()
    pointer = RunDocumentPointer.for_stored(f"s3://rundocs/{key}", body, doc=original)
    # When the object is swapped before the instance boots (and the bootstrap has no --event-bus)
    swapped = a_document(tmp_path, bus, command=[sys.executable, "-c", "open('/tmp/pwned', 'w')"])
    s3.put_object(Bucket="rundocs", Key=key, Body=swapped.model_dump_json().encode())
    with FakeImds(user_data=render_user_data(pointer, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        code, _output = run_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown")

    # Then the refusal reaches the control plane as this attempt's exit, not only the instance's log
    (exited,) = bus.exits()
    assert code == exited["exit_code"] == EXIT_BOOTSTRAP_FAILED
    assert (exited["job_id"], exited["attempt"]) == (original.job_id, original.attempt)
    assert exited["reason"] == "bootstrap-failed"
    assert "SHA-256" in exited["message"]
    assert not (tmp_path / "out.json").exists()


def test_the_pointer_carries_the_digest_of_exactly_the_stored_bytes() -> None:
    body = b'{"job_id": "job-7"}'
    pointer = RunDocumentPointer.for_stored("s3://b/jobs/job-7/attempt-1/run.json", body)

    assert pointer.run_document_sha256 == hashlib.sha256(body).hexdigest()
    with pytest.raises(ValueError, match="run_document_sha256"):
        RunDocumentPointer.model_validate({"run_document_uri": "s3://b/k"})


# ---- the host agent --------------------------------------------------------------------------
class FakeSts:
    """The credentials function as the bootstrap's Lambda client sees it: every invoke vends a session."""

    def __init__(self, lifetime: dt.timedelta = dt.timedelta(hours=1)) -> None:
        self.calls: list[dict[str, Any]] = []
        self.lifetime = lifetime

    def invoke(self, **request: Any) -> dict[str, Any]:
        self.calls.append(request)
        n = len(self.calls)
        expiration = dt.datetime.now(dt.UTC) + self.lifetime
        creds = {"AccessKeyId": f"ASIAJOB{n}", "SecretAccessKey": "s", "SessionToken": "t"}
        body = json.dumps({"credentials": {**creds, "Expiration": expiration.isoformat()}}).encode()
        return {"StatusCode": 200, "Payload": io.BytesIO(body)}


def _unsigned(purpose: str) -> dict[str, Any]:
    return {"headers": {"X-Gpujobs-Job-Session": purpose}, "body": ""}


def a_doc(**changes: Any) -> dict[str, Any]:
    access = {"credentials_function": "gpujobs-CredentialsFunction", "stack": "gpujobs"}
    return {"job_id": "job-7", "attempt": 3, **job_access(), **access, **changes}


@pytest.fixture
def agent() -> Iterator[tuple[HostAgent, Any, FakeSts]]:
    sts = FakeSts()
    with FakeImds(user_data=b"{}") as imds:
        host = HostAgent(JobCredentials(sts, a_doc(), sign=_unsigned), Imds(imds.endpoint)).start()
        yield host, imds, sts
        host.close()


def test_botocore_gets_the_job_credentials_from_the_host_agent_only_with_its_token(
    agent: tuple[HostAgent, Any, FakeSts],
) -> None:
    host, _, sts = agent
    public, private = host.workload_env()

    creds = ContainerProvider(environ={**public, **private}).load()
    assert creds is not None
    assert creds.get_frozen_credentials().access_key == "ASIAJOB1"
    (request,) = (
        sts.calls
    )  # asked of the credentials function, for this attempt only (its tags and policy are the record's)
    assert request["FunctionName"] == "gpujobs-CredentialsFunction"
    asked = json.loads(request["Payload"])
    assert (asked["job_id"], asked["attempt"]) == ("job-7", 3)
    assert asked["headers"]["X-Gpujobs-Job-Session"] == "gpujobs/job-7/3"
    assert "Policy" not in asked
    assert "Tags" not in asked
    # Another process on the host shares the loopback, but not the token
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(public["AWS_CONTAINER_CREDENTIALS_FULL_URI"], timeout=5)
    assert refused.value.code == 401


def test_the_filtered_imds_relays_the_spot_notice_and_nothing_of_the_instance_role(
    agent: tuple[HostAgent, Any, FakeSts],
) -> None:
    host, imds, _ = agent
    imds.announce_termination()

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(host.endpoint + path, timeout=5) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""

    assert get("/latest/meta-data/spot/instance-action")[0] == 200
    for path in ("/latest/meta-data/iam/security-credentials/", "/latest/user-data", "/latest/meta-data/instance-id"):
        assert get(path)[0] == 404, path


def test_credentials_are_renewed_before_the_containers_sdk_would_refetch_them() -> None:
    sts = FakeSts(lifetime=dt.timedelta(minutes=19))
    job = JobCredentials(sts, a_doc(), sign=_unsigned)

    job.served()
    job.served()
    assert len(sts.calls) == 2  # under 20 minutes left: renewed on every ask
    sts.lifetime = dt.timedelta(hours=1)
    job.served()
    job.served()
    assert len(sts.calls) == 3


# ---- docker: private values and IMDS -------------------------------------------------------------
DAEMON = 'cgroupfs 2 ["name=apparmor","name=seccomp,profile=builtin","name=cgroupns"]'
FAKE_DOCKER = """import json, os, sys
argv = sys.argv[1:]
if argv[0] == "info":
    print(os.environ.get("FAKE_DOCKER_INFO", ""))
env_file = argv[argv.index("--env-file") + 1] if "--env-file" in argv else ""
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"argv": argv, "env": dict(os.environ),
                          "file": open(env_file).read() if env_file else "",
                          "mode": oct(os.stat(env_file).st_mode & 0o777) if env_file else ""}) + "\\n")
"""
FAKE_IPTABLES = """import json, os, sys
with open(os.environ["FAKE_IPTABLES_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
sys.exit(1 if sys.argv[1] == "-C" else 0)
"""
A_RUN = {"job_id": "job-7", "attempt": 3, "gpus_per_node": 0, "stop_timeout_seconds": 9, "image": "i", "command": ["c"]}


def a_fake(tmp_path: Path, name: str, code: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{code}")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Fakes of what `block_imds` calls on a host: docker (info, run), iptables, ip6tables, systemctl."""
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "docker.jsonl"))
    monkeypatch.setenv("FAKE_IPTABLES_LOG", str(tmp_path / "iptables.jsonl"))
    monkeypatch.setenv("FAKE_DOCKER_INFO", DAEMON)
    (tmp_path / "cgroup").mkdir()
    systemctl = f"import os, sys; os.mkdir(os.path.join({str(tmp_path / 'cgroup')!r}, sys.argv[2]))"
    return {
        "docker": a_fake(tmp_path, "docker", FAKE_DOCKER),
        "iptables": a_fake(tmp_path, "iptables", FAKE_IPTABLES),
        "ip6tables": a_fake(tmp_path, "ip6tables", FAKE_IPTABLES),
        "systemctl": a_fake(tmp_path, "systemctl", systemctl),
        "cgroup_root": str(tmp_path / "cgroup"),
    }


def block(runtime: runtimes.DockerRuntime, host: dict[str, str], **options: Any) -> None:
    tools = {k: host[k] for k in ("iptables", "ip6tables", "systemctl")}
    runtime.block_imds(**tools, cgroup_root=host["cgroup_root"], **{"ipv6": True, **options})


def logged(tmp_path: Path, name: str) -> list[Any]:
    path = tmp_path / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_docker_gets_the_env_secrets_and_the_token_only_through_a_private_env_file(
    tmp_path: Path, host: dict[str, str]
) -> None:
    runtime = runtimes.DockerRuntime(host["docker"])

    block(runtime, host)
    runtime.start(
        A_RUN, {"GPUJOBS_JOB_ID": "job-7"}, {"HF_TOKEN": HF_TOKEN, "AWS_CONTAINER_AUTHORIZATION_TOKEN": "tok"}
    )
    assert runtime.wait() == 0

    _info, run = logged(tmp_path, "docker")
    assert run["argv"][run["argv"].index("--user") + 1] == "10001:10001"
    assert run["mode"] == "0o600"
    assert run["file"] == f"AWS_CONTAINER_AUTHORIZATION_TOKEN=tok\nGPUJOBS_JOB_ID=job-7\nHF_TOKEN={HF_TOKEN}\n"
    assert HF_TOKEN not in json.dumps(run["argv"])
    assert HF_TOKEN not in json.dumps(run["env"])
    assert "tok" not in run["env"].values()
    assert "GPUJOBS_JOB_ID" not in run["env"]  # the job's env never steers the root docker client
    assert not Path(run["argv"][run["argv"].index("--env-file") + 1]).exists()  # removed once the container ended


@pytest.mark.parametrize(("driver", "parent"), [("cgroupfs", "/gpujobs"), ("systemd", "gpujobs.slice")])
def test_imds_is_refused_to_the_containers_cgroup_over_ipv4_and_ipv6_whatever_its_uid(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch, driver: str, parent: str
) -> None:
    monkeypatch.setenv("FAKE_DOCKER_INFO", DAEMON.replace("cgroupfs", driver))
    runtime = runtimes.DockerRuntime(host["docker"])

    block(runtime, host)
    runtime.start(A_RUN, {})
    assert runtime.wait() == 0

    path = "/" + parent.lstrip("/")
    assert (tmp_path / "cgroup" / path.lstrip("/")).is_dir()  # made before the rules name it
    inserted = [call for call in logged(tmp_path, "iptables") if call[1] == "-I"]
    assert inserted == [
        ["iptables", "-I", "OUTPUT", "-d", "169.254.169.254", "-m", "cgroup", "--path", path, "-j", "REJECT"],
        ["ip6tables", "-I", "OUTPUT", "-d", "fd00:ec2::254", "-m", "cgroup", "--path", path, "-j", "REJECT"],
    ]
    assert not any("--uid-owner" in call for call in logged(tmp_path, "iptables"))
    _info, run = logged(tmp_path, "docker")
    argv = run["argv"]
    assert argv[argv.index("--cgroup-parent") + 1] == parent
    assert argv[argv.index("--security-opt") + 1] == "no-new-privileges"
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--cap-add" not in argv
    assert "--privileged" not in argv
    assert not any("seccomp" in a or "unconfined" in a for a in argv)  # docker's default profile applies


def test_a_present_rule_is_not_inserted_twice_and_a_host_without_ipv6_gets_the_ipv4_rule(
    tmp_path: Path, host: dict[str, str]
) -> None:
    present = FAKE_IPTABLES.replace('sys.exit(1 if sys.argv[1] == "-C" else 0)', "sys.exit(0)")
    host["iptables"] = a_fake(tmp_path, "iptables", present)

    block(runtimes.DockerRuntime(host["docker"]), host, ipv6=False)

    assert [call[:2] for call in logged(tmp_path, "iptables")] == [["iptables", "-C"]]


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        ("ip6tables", "ip6tables: no permission"),
        ("iptables", "iptables: no permission"),
        ("cgroup-v1", "docker runs containers under cgroup v1: the IMDS rule needs cgroup v2"),
        ("seccomp-off", "without a seccomp profile"),
        ("systemctl", "cannot start gpujobs.slice: no systemd"),
    ],
)
def test_without_the_imds_rule_the_container_is_not_started(
    tmp_path: Path, host: dict[str, str], monkeypatch: pytest.MonkeyPatch, broken: str, reason: str
) -> None:
    failing = "import sys; sys.stderr.write('no permission'); sys.exit(1 if sys.argv[1] == '-C' else 4)"
    if broken in ("iptables", "ip6tables"):
        host[broken] = a_fake(tmp_path, broken, failing)
    elif broken == "systemctl":
        monkeypatch.setenv("FAKE_DOCKER_INFO", DAEMON.replace("cgroupfs", "systemd"))
        host["systemctl"] = a_fake(tmp_path, "systemctl", "import sys; sys.stderr.write('no systemd'); sys.exit(1)")
    else:
        daemon = {"cgroup-v1": DAEMON.replace(" 2 ", " 1 "), "seccomp-off": 'cgroupfs 2 ["name=apparmor"]'}[broken]
        monkeypatch.setenv("FAKE_DOCKER_INFO", daemon)
    runtime = runtimes.DockerRuntime(host["docker"])

    with pytest.raises(errors.BootstrapError, match=r"^cannot block IMDS for the container: ") as refused:
        block(runtime, host)

    assert reason in str(refused.value)
    assert runtime.cgroup_parent == ""


def test_a_bootstrap_that_cannot_block_imds_reports_it_and_never_pulls_or_runs(
    tmp_path: Path, bus: Bus, moto_endpoint: str, credentials_function: str
) -> None:
    # Given an instance whose docker runs containers under cgroup v1 (no cgroup match for the rule)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    a_fake(fake_bin, "docker", FAKE_DOCKER)
    a_fake(fake_bin, "shutdown", "")
    doc = a_document(tmp_path, bus, **job_access())
    env = {
        "PATH": str(fake_bin),
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ENDPOINT_URL_LAMBDA": credentials_function,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FAKE_DOCKER_LOG": str(tmp_path / "docker.jsonl"),
        "FAKE_DOCKER_INFO": DAEMON.replace(" 2 ", " 1 "),
    }
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region=REGION), instance_id=INSTANCE_ID) as imds:
        env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.endpoint
        argv = [sys.executable, str(BOOTSTRAP), "--runtime", "docker", "--no-shutdown"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)

    # Then the attempt fails as the bootstrap's, saying why, and docker was asked nothing but `info`
    (exited,) = bus.exits()
    assert done.returncode == exited["exit_code"] == EXIT_BOOTSTRAP_FAILED, done.stdout + done.stderr
    assert exited["reason"] == "bootstrap-failed"
    assert "cannot block IMDS for the container: docker runs containers under cgroup v1" in exited["message"]
    assert [call["argv"][0] for call in logged(tmp_path, "docker")] == ["info"]


def test_a_private_env_file_is_readable_by_its_owner_only() -> None:
    from gpujobs.instance.job_secrets import EnvFile

    env_file = EnvFile({"A": "1"})
    try:
        assert stat.S_IMODE(os.stat(env_file.path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(env_file.folder).st_mode) == 0o700
    finally:
        env_file.close()
    with pytest.raises(errors.BootstrapError, match="line break"):
        EnvFile({"PEM": "a\nb"})


def test_a_run_document_holds_secret_references_never_values() -> None:
    doc = RunDocument(
        job_id="j",
        attempt=1,
        name="n",
        image="i",
        command=["c"],
        checkpoint_uri="s3://b/jobs/j/ckpt",
        secrets={"HF_TOKEN": "ssm:/gpujobs/t/hf"},
    )
    assert json.loads(doc.model_dump_json())["secrets"] == {"HF_TOKEN": "ssm:/gpujobs/t/hf"}
