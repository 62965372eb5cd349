"""gpujobs instance bootstrap: the one fixed program every training instance runs.

The shell part of the user data is the same bytes for every job: it feeds this file to python3 through a
quoted heredoc. Everything job-specific is JSON (the run document), read here as data. Every child
process starts from an argv list, never a shell, and env values reach `docker run` through its
environment (`-e NAME`), never argv. So no job field is ever parsed by a shell or shown by `ps`.

Steps: run document (IMDSv2 user data, --user-data FILE, or an S3 pointer) -> instance facts (IMDS) ->
rendezvous (rank 0's private IP is the master) -> image pull -> for a replacement, wait (bounded) for the
interrupted attempt to end -> workload (runtime `docker` or `process`; SIGTERM/SIGINT are forwarded) ->
"Job Exited" on the event bus -> `shutdown -h now`.
Needs only Python 3.9+ and boto3 (a bare AMI). See docs/instance.md.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import email
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

EXIT_BOOTSTRAP_FAILED = 127
EVENT_SOURCE = "gpujobs.instance"
EVENT_DETAIL_TYPE = "Job Exited"
TAG_JOB_ID, TAG_ATTEMPT = "gpujobs:job-id", "gpujobs:attempt"
CW_AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
CW_AGENT_CONFIG = "/opt/aws/amazon-cloudwatch-agent/etc/gpujobs-gpu.json"
ATTEMPT_ALIVE_STATES = ["pending", "running", "stopping", "shutting-down"]
LAST_COMMIT_REASONS = ("preempted", "final")  # what an attempt commits as it ends (docs/training.md)
_STEP_DIR = re.compile(r"^step-(\d{8})/?$")  # the trainer's checkpoint folders
_ECR_IMAGE = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?(?=/)")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REQUIRED = object()
# name -> (type, default); mirrors gpujobs.domain.rundoc.RunDocument (a unit test keeps them equal).
FIELDS: dict[str, tuple[type, Any]] = {
    "version": (int, 1),
    "job_id": (str, _REQUIRED),
    "attempt": (int, _REQUIRED),
    "name": (str, _REQUIRED),
    "image": (str, _REQUIRED),
    "command": (list, _REQUIRED),
    "env": (dict, {}),
    "nodes": (int, 1),
    "gpus_per_node": (int, 1),
    "checkpoint_uri": (str, _REQUIRED),
    "resume_from_step": (int, None),
    "checkpoint_every_minutes": (int, 30),
    "event_bus": (str, ""),
    "region": (str, ""),
    "master_port": (int, 29500),
    "stop_timeout_seconds": (int, 120),
    "wait_for_attempt": (int, None),
}
Clients = Callable[[str], Any]  # service name -> boto3 client


class BootstrapError(Exception):
    """The instance cannot run the job; reported as reason "bootstrap-failed"."""


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} gpujobs-bootstrap: {message}", flush=True)


# --- the run document -------------------------------------------------------------------------------


def extract_run_json(raw: bytes) -> dict[str, Any]:
    """The JSON object in user data: gzip or not, a MIME multipart's one application/json part, or bare."""
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    text: Any = raw
    if not raw.lstrip().startswith(b"{"):
        parts = [p for p in email.message_from_bytes(raw).walk() if p.get_content_type() == "application/json"]
        if len(parts) != 1:
            raise BootstrapError(f"user data holds {len(parts)} application/json parts, expected 1")
        text = parts[0].get_payload(decode=True)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BootstrapError(f"run document is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BootstrapError("run document is not a JSON object")
    return data


def is_pointer(data: dict[str, Any]) -> bool:
    return set(data) == {"run_document_uri"}


def check_document(data: dict[str, Any]) -> dict[str, Any]:
    """Validate field names and types (stdlib stand-in for the pydantic model) and fill defaults."""
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise BootstrapError(f"run document has unknown fields {unknown}")
    doc: dict[str, Any] = {}
    for name, (kind, default) in FIELDS.items():
        value = data.get(name, default)
        if value is _REQUIRED:
            raise BootstrapError(f"run document lacks {name}")
        if not (value is None and default is None) and (
            not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        ):
            raise BootstrapError(f"run document field {name} is not a {kind.__name__}")
        doc[name] = value
    if doc["version"] != 1:
        raise BootstrapError(f"run document version {doc['version']} is not supported")
    if not doc["command"] or not all(isinstance(a, str) for a in doc["command"]):
        raise BootstrapError("command must be a non-empty list of strings")
    for key, value in doc["env"].items():
        if not _ENV_NAME.match(key) or key.startswith("DOCKER_") or not isinstance(value, str):
            raise BootstrapError(f"env name {key!r} is not allowed or its value is not a string")
    if not doc["image"] or doc["image"].startswith("-") or any(c.isspace() for c in doc["image"]):
        raise BootstrapError(f"image {doc['image']!r} is not an image reference")
    if doc["wait_for_attempt"] is not None and not 0 <= doc["wait_for_attempt"] < doc["attempt"]:
        raise BootstrapError(f"wait_for_attempt {doc['wait_for_attempt']} is not an earlier attempt")
    return doc


def load_document(raw: bytes, s3: Callable[[], Any], partial: dict[str, Any]) -> dict[str, Any]:
    """The run document from user data, following an S3 pointer; `partial` keeps what was readable."""
    data = extract_run_json(raw)
    if is_pointer(data):
        uri = str(data["run_document_uri"])
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        if not uri.startswith("s3://") or not key:
            raise BootstrapError(f"run_document_uri {uri!r} is not s3://bucket/key")
        data = extract_run_json(s3().get_object(Bucket=bucket, Key=key)["Body"].read())
    partial["raw"] = data
    return check_document(data)


# --- instance metadata (IMDSv2) -----------------------------------------------------------------


class Imds:
    """IMDSv2 client: a session token from PUT /latest/api/token, then GETs carrying it."""

    def __init__(self, endpoint: str | None = None, *, tries: int = 5, timeout: float = 2.0) -> None:
        default = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or "http://169.254.169.254"
        self.endpoint = (endpoint or default).rstrip("/")
        if not self.endpoint.startswith(("http://", "https://")):
            raise BootstrapError(f"IMDS endpoint {self.endpoint!r} is not http(s)")
        self.tries, self.timeout = tries, timeout
        self._token: str | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _call(self, method: str, path: str, headers: dict[str, str]) -> bytes:
        for attempt in range(self.tries):
            try:
                request = urllib.request.Request(self.endpoint + path, method=method, headers=headers)  # noqa: S310
                with self._opener.open(request, timeout=self.timeout) as response:
                    body: bytes = response.read()
                    return body
            except urllib.error.HTTPError as exc:
                if exc.code == 404 or attempt == self.tries - 1:
                    raise BootstrapError(f"IMDS {method} {path}: HTTP {exc.code}") from exc
                if exc.code == 401:
                    self._token = None
            except OSError as exc:
                if attempt == self.tries - 1:
                    raise BootstrapError(f"IMDS {method} {path}: {exc}") from exc
            time.sleep(min(2**attempt, 5) / 4)
        raise AssertionError("unreachable")

    def get(self, path: str) -> bytes:
        if self._token is None:
            ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}
            self._token = self._call("PUT", "/latest/api/token", ttl).decode()
        return self._call("GET", path, {"X-aws-ec2-metadata-token": self._token})

    def facts(self) -> dict[str, Any]:
        meta = {
            k: self.get("/latest/meta-data/" + k).decode().strip()
            for k in ("instance-id", "ami-launch-index", "local-ipv4", "placement/region")
        }
        return {
            "instance_id": meta["instance-id"],
            "launch_index": int(meta["ami-launch-index"]),
            "local_ipv4": meta["local-ipv4"],
            "region": meta["placement/region"],
        }


# --- rendezvous ---------------------------------------------------------------------------------


def rendezvous(
    ec2: Any,
    *,
    job_id: str,
    attempt: int,
    nodes: int,
    instance_id: str,
    own_ip: str,
    timeout: float = 900.0,
    poll: float = 5.0,
) -> tuple[int, str]:
    """(node rank, master address). Waits until all `nodes` instances of this attempt are visible.

    Ranks are positions in the members sorted by (AMI launch index, instance id): the launch index
    itself when one RunInstances call launched them all, still consistent when several did.
    """
    if nodes <= 1:
        return 0, own_ip or "127.0.0.1"
    deadline = time.monotonic() + timeout
    filters = [
        {"Name": f"tag:{TAG_JOB_ID}", "Values": [job_id]},
        {"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(attempt)]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ]
    while True:
        members = sorted(
            (i["AmiLaunchIndex"], i["InstanceId"], i.get("PrivateIpAddress", ""))
            for page in ec2.get_paginator("describe_instances").paginate(Filters=filters)
            for r in page["Reservations"]
            for i in r["Instances"]
        )
        if len(members) >= nodes and all(ip for _, _, ip in members):
            break
        if time.monotonic() > deadline:
            raise BootstrapError(f"rendezvous: {len(members)} of {nodes} instances after {timeout:.0f}s")
        time.sleep(poll)
    ids = [iid for _, iid, _ in members]
    if len(members) > nodes or instance_id not in ids:
        raise BootstrapError(f"rendezvous: instances {ids} do not match {nodes} nodes including {instance_id}")
    return ids.index(instance_id), members[0][2]


# --- waiting for the interrupted attempt ---------------------------------------------------------


def attempt_instances(ec2: Any, *, job_id: str, attempt: int) -> list[str]:
    """Instances of `attempt` that may still run its workload (anything short of stopped/terminated)."""
    filters = [
        {"Name": f"tag:{TAG_JOB_ID}", "Values": [job_id]},
        {"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(attempt)]},
        {"Name": "instance-state-name", "Values": ATTEMPT_ALIVE_STATES},
    ]
    return sorted(
        i["InstanceId"]
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters)
        for r in page["Reservations"]
        for i in r["Instances"]
    )


def last_commit_by(s3: Any, *, uri: str, attempt: int, after_step: int | None) -> int | None:
    """The step of the checkpoint `attempt` committed as it ended, if newer than `after_step`; else None.

    Reads the trainer's layout on S3: `<uri>/step-NNNNNNNN/COMMIT.json`, which records `attempt` and
    `reason`. Only `preempted` or `final` counts: after a periodic commit the attempt may still be
    writing its preemption checkpoint. Other URI schemes are not read (None).
    """
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme != "s3":
        return None
    prefix = parsed.path.strip("/")
    base = prefix + "/" if prefix else ""
    steps: list[int] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=parsed.netloc, Prefix=base, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            match = _STEP_DIR.match(common["Prefix"][len(base) :])
            if match and int(match.group(1)) > (-1 if after_step is None else after_step):
                steps.append(int(match.group(1)))
    for step in sorted(steps, reverse=True):
        try:
            body = s3.get_object(Bucket=parsed.netloc, Key=f"{base}step-{step:08d}/COMMIT.json")["Body"].read()
            marker = json.loads(body)
        except (s3.exceptions.NoSuchKey, ValueError):
            continue  # a save cut short, or not a marker
        if (
            isinstance(marker, dict)
            and marker.get("attempt") == attempt
            and marker.get("reason") in LAST_COMMIT_REASONS
        ):
            return step
    return None


def wait_for_attempt(
    ec2: Any,
    *,
    job_id: str,
    attempt: int,
    timeout: float = 240.0,
    poll: float = 5.0,
    committed: Callable[[], int | None] | None = None,
) -> str:
    """Wait until the interrupted `attempt` has ended; returns why the wait is over.

    It has ended when none of its instances is left, or when `committed` finds the checkpoint it
    wrote as it ended. After `timeout` (the 2-minute spot notice plus margin) the wait is over anyway:
    the trainer resumes from the newest committed checkpoint either way, so waiting only avoids
    resuming from an older one. API errors are logged and waited out, never fatal.
    """
    deadline = time.monotonic() + timeout
    live: list[str] | None = None
    while True:
        try:
            live = attempt_instances(ec2, job_id=job_id, attempt=attempt)
        except StoppedError:
            raise
        except Exception as exc:  # a replacement must start even when EC2 cannot be asked
            log(f"cannot list the instances of attempt {attempt}: {exc}")
        if live == []:
            return f"attempt {attempt} has no instances left"
        if committed is not None:
            try:
                step = committed()
            except StoppedError:
                raise
            except Exception as exc:  # the instances are still a reliable signal
                log(f"cannot read checkpoints, waiting for the instances only: {exc}")
                committed = None
            else:
                if step is not None:
                    return f"attempt {attempt} committed its last checkpoint, step {step}"
        left = deadline - time.monotonic()
        if left <= 0:
            return f"attempt {attempt} still has instances {live} after {timeout:.0f}s; starting anyway"
        time.sleep(min(poll, left))


def container_env(doc: dict[str, Any], *, rank: int, master_addr: str, instance_id: str, region: str) -> dict[str, str]:
    """The spec's env plus the GPUJOBS_* contract (which wins on a name clash)."""
    env = dict(doc["env"])
    env.update(
        {
            "GPUJOBS_JOB_ID": doc["job_id"],
            "GPUJOBS_ATTEMPT": str(doc["attempt"]),
            "GPUJOBS_NNODES": str(doc["nodes"]),
            "GPUJOBS_NODE_RANK": str(rank),
            "GPUJOBS_NPROC_PER_NODE": str(doc["gpus_per_node"] or 1),
            "GPUJOBS_MASTER_ADDR": master_addr,
            "GPUJOBS_MASTER_PORT": str(doc["master_port"]),
            "GPUJOBS_CHECKPOINT_URI": doc["checkpoint_uri"],
            "GPUJOBS_CHECKPOINT_EVERY_MINUTES": str(doc["checkpoint_every_minutes"]),
            "GPUJOBS_EVENT_BUS": doc["event_bus"],
            "GPUJOBS_INSTANCE_ID": instance_id,
            "AWS_REGION": region,
            "AWS_DEFAULT_REGION": region,
        }
    )
    if doc["resume_from_step"] is not None:
        env["GPUJOBS_RESUME_FROM_STEP"] = str(doc["resume_from_step"])
    return env


# --- runtimes -----------------------------------------------------------------------------------


class Runtime:
    """Runs one workload: `prepare` (may fail the bootstrap), `start`, `wait` -> exit code, `stop`."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def prepare(self, doc: dict[str, Any], clients: Clients) -> None:
        """Nothing to fetch by default."""

    def start(self, doc: dict[str, Any], env: dict[str, str]) -> None:
        raise NotImplementedError

    def wait(self) -> int:
        assert self.proc is not None
        code = self.proc.wait()
        return 128 - code if code < 0 else code  # killed by signal N -> 128+N, as a shell reports it

    def stop(self, signum: int, timeout: int) -> None:
        raise NotImplementedError


class ProcessRuntime(Runtime):
    """Local processes (local cloud, tests): `entrypoint + command` in its own process group."""

    PASSTHROUGH = (
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "LC_ALL",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "AWS_ENDPOINT_URL",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
    )

    def __init__(self, entrypoint: list[str] | None = None) -> None:
        super().__init__()
        self.entrypoint = entrypoint or []

    def start(self, doc: dict[str, Any], env: dict[str, str]) -> None:
        full = {k: os.environ[k] for k in self.PASSTHROUGH if k in os.environ}
        full.update(env)
        self.proc = subprocess.Popen(
            [*self.entrypoint, *doc["command"]], env=full, stdin=subprocess.DEVNULL, start_new_session=True
        )

    def stop(self, signum: int, timeout: int) -> None:
        self._signal(signum)
        kill = threading.Timer(timeout, self._signal, (signal.SIGKILL,))  # like docker's stop timeout
        kill.daemon = True
        kill.start()

    def _signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)


class DockerRuntime(Runtime):
    """`docker run` on EC2: ECR login (password on stdin), pull, GPU metrics agent, run, stop."""

    def __init__(self, docker: str = "docker") -> None:
        super().__init__()
        self.docker = shutil.which(docker) or docker  # resolved now: the job's env may set PATH
        self.name = ""

    def prepare(self, doc: dict[str, Any], clients: Clients) -> None:
        image = doc["image"]
        ecr = _ECR_IMAGE.match(image)
        if ecr:
            auth = clients("ecr").get_authorization_token(registryIds=[ecr.group(1)])["authorizationData"][0]
            password = base64.b64decode(auth["authorizationToken"]).decode().partition(":")[2]
            self._docker("login", "--username", "AWS", "--password-stdin", ecr.group(0), stdin=password)
        self._docker("pull", image)
        if doc["gpus_per_node"] > 0 and os.path.exists(CW_AGENT_CTL):
            start_cloudwatch_agent()

    def _docker(self, *args: str, stdin: str = "") -> None:
        done = subprocess.run([self.docker, *args], input=stdin.encode(), capture_output=True, check=False)
        if done.returncode != 0:
            raise BootstrapError(f"docker {args[0]} failed ({done.returncode}): {done.stderr.decode()[-500:]}")

    def start(self, doc: dict[str, Any], env: dict[str, str]) -> None:
        self.name = "gpujobs-" + re.sub(r"[^a-zA-Z0-9_.-]", "-", doc["job_id"]) + f"-a{doc['attempt']}"
        argv = [self.docker, "run", "--rm", "--name", self.name]
        argv += ["--gpus", "all"] if doc["gpus_per_node"] > 0 else []
        argv += ["--network", "host", "--ipc", "host", "--stop-timeout", str(doc["stop_timeout_seconds"])]
        for key in sorted(env):
            argv += ["-e", key]  # the value comes from this process's environment, never argv
        self.proc = subprocess.Popen(
            [*argv, doc["image"], *doc["command"]], env={**os.environ, **env}, stdin=subprocess.DEVNULL
        )

    def stop(self, signum: int, timeout: int) -> None:
        del signum  # docker stop sends the image's STOPSIGNAL, then SIGKILL after the timeout
        argv = [self.docker, "stop", "-t", str(timeout), self.name]
        threading.Thread(target=subprocess.run, args=(argv,), kwargs={"check": False}, daemon=True).start()


def cloudwatch_agent_config() -> dict[str, Any]:
    """NVIDIA GPU metrics every 60 s in CWAgent, plus a per-instance series for idle alarms."""
    return {
        "agent": {"metrics_collection_interval": 60, "run_as_user": "root"},
        "metrics": {
            "namespace": "CWAgent",
            "append_dimensions": {"InstanceId": "${aws:InstanceId}"},
            "aggregation_dimensions": [["InstanceId"]],
            "metrics_collected": {
                "nvidia_gpu": {
                    "measurement": ["utilization_gpu", "utilization_memory", "memory_used"],
                    "metrics_collection_interval": 60,
                }
            },
        },
    }


def start_cloudwatch_agent() -> None:
    """Best effort: GPU metrics feed idle alarms, but missing them must not stop training."""
    try:
        with open(CW_AGENT_CONFIG, "w", encoding="utf-8") as f:
            json.dump(cloudwatch_agent_config(), f)
        argv = [CW_AGENT_CTL, "-a", "fetch-config", "-m", "ec2", "-s", "-c", "file:" + CW_AGENT_CONFIG]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"CloudWatch agent not started: {exc}")


# --- exit report --------------------------------------------------------------------------------


def publish_exit(
    events: Callable[[], Any], *, bus: str, detail: dict[str, Any], tries: int = 4, backoff: float = 1.0
) -> bool:
    """Put "Job Exited" on the bus; retried, and a failure is logged, never raised."""
    entry = {"Source": EVENT_SOURCE, "DetailType": EVENT_DETAIL_TYPE, "Detail": json.dumps(detail), "EventBusName": bus}
    for attempt in range(tries):
        try:
            response = events().put_events(Entries=[entry])
            if not response.get("FailedEntryCount"):
                return True
            log(f"put_events rejected the event: {response.get('Entries')}")
        except Exception as exc:  # reporting must never crash the bootstrap
            log(f"put_events failed: {exc}")
        if attempt < tries - 1:
            time.sleep(backoff * 2**attempt)
    return False


# --- main ---------------------------------------------------------------------------------------


def _client(service: str, region: str) -> Any:
    import boto3  # imported late: the launch Lambda imports this module for its parser only

    return boto3.client(service, region_name=region)  # type: ignore[call-overload]  # any service by name


class StoppedError(Exception):
    """SIGTERM/SIGINT before the workload started: give up at once (pull, rendezvous, ...)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum} before the workload started")
        self.signum = signum


class _Stopper:
    """Signal handler: before the workload starts, abort; once it runs, forward the signal to it."""

    def __init__(self) -> None:
        self.signum = 0
        self.starting = False
        self.runtime: Runtime | None = None
        self.timeout = 120

    def __call__(self, signum: int, _frame: object) -> None:
        os.write(2, f"gpujobs-bootstrap: received signal {signum}\n".encode())  # print() is not reentrant
        self.signum = signum
        if self.runtime is not None:
            self.runtime.stop(signum, self.timeout)
        elif not self.starting:
            raise StoppedError(signum)


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port")
    return port


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpujobs-bootstrap", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--user-data", metavar="FILE", help="read user data here instead of from IMDS")
    parser.add_argument("--runtime", choices=("docker", "process"), default="docker")
    parser.add_argument("--entrypoint", default="", help="process runtime: argv prefix, split like a shell")
    parser.add_argument("--no-shutdown", action="store_true", help="do not power off at the end")
    parser.add_argument("--rendezvous-timeout", type=float, default=900.0, metavar="SECONDS")
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=240.0,
        metavar="SECONDS",
        help="longest wait for the interrupted attempt (the document's wait_for_attempt) to end",
    )
    parser.add_argument("--event-bus", default="", help="bus for the exit event if the document is unreadable")
    parser.add_argument(
        "--master-addr",
        default="",
        metavar="ADDR",
        help="local cloud: use ADDR as the master instead of rank 0's private IP (which may be unreachable)",
    )
    parser.add_argument(
        "--master-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="local cloud: use PORT instead of the document's master_port (several jobs share one host)",
    )
    return parser.parse_args(argv)


def _run(args: argparse.Namespace, stopper: _Stopper, state: dict[str, Any]) -> tuple[int, str]:
    imds = Imds()
    if args.user_data:
        with open(args.user_data, "rb") as f:
            raw = f.read()
    else:
        raw = imds.get("/latest/user-data")
    facts = imds.facts()
    state.update(facts)

    def clients(service: str) -> Any:
        return _client(service, state["region"])

    doc = load_document(raw, lambda: clients("s3"), state)
    state["doc"] = doc
    state["region"] = doc["region"] or facts["region"]
    log(f"job {doc['job_id']} attempt {doc['attempt']} on {facts['instance_id']}")
    rank, master = rendezvous(
        clients("ec2"),
        job_id=doc["job_id"],
        attempt=doc["attempt"],
        nodes=doc["nodes"],
        instance_id=facts["instance_id"],
        own_ip=facts["local_ipv4"],
        timeout=args.rendezvous_timeout,
    )
    state["rank"] = rank
    master = args.master_addr or master
    if args.master_port is not None:
        doc = {**doc, "master_port": args.master_port}
    runtime: Runtime = ProcessRuntime(shlex.split(args.entrypoint)) if args.runtime == "process" else DockerRuntime()
    runtime.prepare(doc, clients)
    if doc["wait_for_attempt"] is not None:
        previous = doc["wait_for_attempt"]
        s3 = clients("s3")
        log(f"waiting up to {args.wait_timeout:.0f}s for attempt {previous} to end")
        ended = wait_for_attempt(
            clients("ec2"),
            job_id=doc["job_id"],
            attempt=previous,
            timeout=args.wait_timeout,
            committed=lambda: last_commit_by(
                s3, uri=doc["checkpoint_uri"], attempt=previous, after_step=doc["resume_from_step"]
            ),
        )
        log(ended)
    env = container_env(doc, rank=rank, master_addr=master, instance_id=facts["instance_id"], region=state["region"])
    log(f"starting the workload as node {rank} of {doc['nodes']}, master {master}")
    stopper.timeout, stopper.starting = doc["stop_timeout_seconds"], True
    runtime.start(doc, env)
    stopper.runtime = runtime
    if stopper.signum:  # arrived while starting
        runtime.stop(stopper.signum, stopper.timeout)
    code = runtime.wait()
    signalled = f" after signal {stopper.signum}" if stopper.signum else ""
    return code, f"workload exited with {code}{signalled}"


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    stopper = _Stopper()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stopper)
    state: dict[str, Any] = {"region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")}
    try:
        code, message = _run(args, stopper, state)
        reason = "exited"
    except StoppedError as exc:
        code, reason, message = 128 + exc.signum, "bootstrap-failed", str(exc)
    except Exception as exc:  # every failure must still be reported
        code, reason, message = EXIT_BOOTSTRAP_FAILED, "bootstrap-failed", f"{type(exc).__name__}: {exc}"
    stopper.starting = True  # from here on a signal is only remembered: the exit must still be reported
    log(f"{reason}: {message}")
    doc: dict[str, Any] = state.get("doc") or state.get("raw") or {}
    bus = doc.get("event_bus") or args.event_bus
    detail = {
        "job_id": doc.get("job_id"),
        "attempt": doc.get("attempt"),
        "node_rank": state.get("rank"),
        "instance_id": state.get("instance_id"),
        "exit_code": code,
        "reason": reason,
        "message": message,
    }
    if bus and state.get("region"):
        publish_exit(lambda: _client("events", state["region"]), bus=str(bus), detail=detail)
    else:
        log("no event bus or region known: the exit is not published")
    if not args.no_shutdown:
        subprocess.run(["shutdown", "-h", "now"], check=False)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
