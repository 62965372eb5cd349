"""The container runtimes: how the workload is started, waited for and stopped.

`docker` runs on EC2 (ECR login with the password on stdin, pull, `docker run`; no login and no pull
when the image is on the host, provably the one asked for: a baked AMI, `images.py`); `process` runs the
command as a local process (the local cloud, tests), directly or through an engine called as
`docker run` is (`ENGINE IMAGE COMMAND...`). Both start from an argv list, never a shell, so no job
string is parsed by a shell. `docker run` gets the workload's whole environment (the job's env and
what is private: secret values, the credentials token) from one 0600 `--env-file`, never argv
(`ps`) nor the docker client's own environment, where a job's `GODEBUG`, `HTTPS_PROXY` or
`SSL_CERT_FILE` would steer the root docker client itself; a process gets it in its own environment
only. Devices and mounts for the container belong in `DockerRuntime.start`, its confinement
(capabilities, no-new-privileges, the IMDS rule) in `confinement.py`.

The workload's output goes to CloudWatch Logs once `send_output_to` names a stream: docker's own
`awslogs` driver on EC2 (non-blocking, so a slow CloudWatch never stalls a training step's print;
the daemon writes with the instance role), the bootstrap's `LogShipper` for a process, whose output
is also echoed to the bootstrap's stdout as before.

The job's output folder (`outputs_folder`) is a fresh host folder: docker mounts it into the
container at `OUTPUTS_IN_CONTAINER`; a process gets the host path. The checkpoint staging folder
(`staging_folder`) is mounted the same way at `CHECKPOINTS_IN_CONTAINER`, from the instance store
when the host has one; an EFA host's uverbs devices and an unlimited memlock go to the container too
(`use_efa`), since a container can neither open devices it was not given nor raise its own limit.

The workload's stderr passes through this process, which keeps its last line: a workload that
cannot start (docker's 125/126/127) or stops on an error says why there, and the exit report
quotes it.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

from gpujobs.instance import aws, confinement, images
from gpujobs.instance.aws import Clients
from gpujobs.instance.cloudwatch_logs import LogShipper, pump
from gpujobs.instance.contract import WORKLOAD_UID, container_name
from gpujobs.instance.errors import BootstrapError
from gpujobs.instance.job_secrets import EnvFile, refuse_line_breaks
from gpujobs.instance.log import log

_ECR_IMAGE = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?(?=/)")
HOST_DATA_DIR = "/var/lib/gpujobs"
"""Where docker's output folders live on the instance: the root volume (/tmp may be held in memory)."""
OUTPUTS_IN_CONTAINER = "/var/lib/gpujobs/outputs"
CHECKPOINTS_IN_CONTAINER = "/var/lib/gpujobs/checkpoints"
OUR_INFO_LINE = re.compile(rb"^\s*\[gpujobs (?:launch|rank [^\]]*)\] (?:INFO|DEBUG) ")
"""The launcher's and the trainer's own progress lines ("torchrun exited 1; job outcome: crash"): never
an exit message. Their warnings and errors (a configuration error's reason) are, like the workload's."""
"""The training image's GPUJOBS_LOCAL_CHECKPOINT_DIR: docker mounts the host's staging folder there."""


def _registry_client(ecr: re.Match[str], clients: Clients) -> Any:
    """An ECR client in the registry's own region: its tokens and answers come from there (the Deep
    Learning Containers' account 763104351884 has a registry per region), not where the job runs."""
    registry_region = ecr.group(2)
    ecr_client = clients("ecr")
    if getattr(getattr(ecr_client, "meta", None), "region_name", registry_region) != registry_region:
        ecr_client = aws.client("ecr", registry_region)
    return ecr_client


class Runtime:
    """Runs one workload: `prepare` (may fail the bootstrap), `start`, `wait` -> exit code, `stop`."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_line = "(no output on stderr)"
        self._relay: threading.Thread | None = None
        self.shipper: LogShipper | None = None
        """Where the workload's output also goes, for runtimes that ship it themselves (`send_output_to`)."""
        self.unstarted = 0
        """127/126 when the command was not found / not executable (no `proc`), as docker or a shell says."""

    def prepare(self, doc: dict[str, Any], clients: Clients) -> None:
        """Nothing to fetch by default."""

    def send_output_to(self, *, group: str, stream: str, region: str, clients: Clients) -> None:
        """Ship the workload's stdout and stderr to CloudWatch Logs `group`/`stream` (before `start`)."""
        raise NotImplementedError

    def outputs_folder(self) -> tuple[str, str]:
        """A new folder on this host for the workload's outputs, and its path as the workload sees it."""
        folder = tempfile.mkdtemp(prefix="gpujobs-outputs-")
        return folder, folder

    def staging_folder(self, base: str | None) -> str:
        """The checkpoint staging folder as the workload sees it, made under `base`; "" keeps the workload's own."""
        del base
        return ""

    def start(self, doc: dict[str, Any], env: dict[str, str], private: dict[str, str] | None = None) -> None:
        """Start the workload with `env` and `private` (values that must stay off argv and logs)."""
        raise NotImplementedError

    def wait(self) -> int:
        if self.unstarted:
            return self.unstarted
        assert self.proc is not None
        code = self.proc.wait()
        if self._relay is not None:
            self._relay.join(2)
        return 128 - code if code < 0 else code  # killed by signal N -> 128+N, as a shell reports it

    def _popen(self, argv: list[str], env: dict[str, str], **options: Any) -> None:
        try:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, **options)
        except (FileNotFoundError, PermissionError) as exc:  # the workload's exit, as docker or a shell reports it
            self.unstarted = 127 if isinstance(exc, FileNotFoundError) else 126
            self.last_line = f"{argv[0]}: {exc.strerror}"
            return
        self._relay = threading.Thread(target=self._pass_stderr, args=(self.proc.stderr,), daemon=True)
        self._relay.start()

    def _pass_stderr(self, stream: IO[bytes]) -> None:
        """Copy the workload's stderr to ours, keeping its last line (a descendant may hold it open: wait
        joins this thread for a moment only, by when that line has been read)."""
        for line in stream:
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()
            if self.shipper is not None:
                self.shipper.write(line.decode("utf-8", "replace"))
            if line.strip() and not OUR_INFO_LINE.match(line):
                self.last_line = line.decode(errors="replace").strip()[-300:]

    def stop(self, signum: int, timeout: int) -> None:
        raise NotImplementedError

    def keep_for_inspection(self, doc: dict[str, Any]) -> bool:
        """After a crash, with `keep_on_failure`: keep what the workload left for inspection; False: nothing
        can be kept. A process leaves its files on the host, which stays up."""
        del doc
        return True


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

    def __init__(self, entrypoint: list[str] | None = None, engine: list[str] | None = None) -> None:
        super().__init__()
        self.entrypoint = entrypoint or []
        self.engine = engine or []
        self._pump: threading.Thread | None = None

    CREDENTIALS = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"})
    """Passed through only when the job has no credentials of its own: an env key beats the endpoint."""

    def start(self, doc: dict[str, Any], env: dict[str, str], private: dict[str, str] | None = None) -> None:
        own_credentials = "AWS_CONTAINER_CREDENTIALS_FULL_URI" in env
        names = [k for k in self.PASSTHROUGH if not (own_credentials and k in self.CREDENTIALS)]
        if own_credentials:
            names = [k for k in names if k not in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")]
        full = {k: os.environ[k] for k in names if k in os.environ}
        full.update(env)
        full.update(private or {})
        argv = [*self.engine, doc["image"]] if self.engine else self.entrypoint
        output = subprocess.PIPE if self.shipper else None  # None: the bootstrap's own stdout
        self._popen([*argv, *doc["command"]], full, start_new_session=True, stdout=output)
        if self.shipper is not None and self.proc is not None:
            assert self.proc.stdout is not None
            copy = {"echo": sys.stdout.buffer, "shipper": self.shipper}
            self._pump = threading.Thread(target=pump, args=(self.proc.stdout,), kwargs=copy, daemon=True)
            self._pump.start()

    def send_output_to(self, *, group: str, stream: str, region: str, clients: Clients) -> None:
        del region  # the client is already in the job's region
        self.shipper = LogShipper(lambda: clients("logs"))
        self.shipper.open(group, stream)

    def wait(self) -> int:
        code = super().wait()
        if self._pump is not None:  # a process the workload left behind may hold the pipe: bounded
            self._pump.join(timeout=5)
        if self.shipper is not None:
            self.shipper.close()
        return code

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
    """`docker run` on EC2: ECR login (password on stdin) and pull unless the image is on the host
    (`images.py`), GPU metrics agent, run, stop."""

    def __init__(self, docker: str = "docker") -> None:
        super().__init__()
        self.docker = shutil.which(docker) or docker  # resolved now: the job's env may set PATH
        self.name = ""
        self.user = WORKLOAD_UID
        self.cgroup_parent = ""
        """`--cgroup-parent`, once `block_imds` has refused IMDS to that group."""
        self.env_file: EnvFile | None = None
        self.log_options: list[str] = []
        self.mounts: list[str] = []
        self.devices: list[str] = []

    def block_imds(
        self,
        *,
        iptables: str = "iptables",
        ip6tables: str = "ip6tables",
        systemctl: str = "systemctl",
        cgroup_root: str | None = None,
        cgroup_name: str = confinement.CGROUP_NAME,
        ipv6: bool | None = None,
    ) -> None:
        """Refuse IMDS (IPv4 and IPv6) to the container's control group, and run the container there.

        The group is made first, then the rules name it (`confinement.py` says why by the group and
        not the uid). Any failure fails the bootstrap: the container would otherwise reach the
        instance role.
        """
        try:
            driver = confinement.check_daemon(self._docker_output("info", "--format", confinement.DAEMON_FORMAT))
            parent, path = confinement.cgroup_parent(driver, cgroup_name)
            root = cgroup_root or confinement.cgroup2_root()
            confinement.make_cgroup(driver, path, root=root, systemctl=systemctl)
            rules = confinement.imds_rules(path)
            if not (confinement.has_ipv6() if ipv6 is None else ipv6):
                log("this host has no IPv6 stack: IMDS's fd00:ec2::254 is unreachable, only the IPv4 rule is needed")
                rules = [(tool, rule) for tool, rule in rules if tool == "iptables"]
            confinement.install_rules(rules, {"iptables": iptables, "ip6tables": ip6tables})
        except (BootstrapError, OSError) as exc:  # OSError: the cgroup folder or mount table
            raise BootstrapError(f"cannot block IMDS for the container: {exc}") from None
        self.cgroup_parent = parent
        log(f"IMDS is refused to the container's control group {parent} ({driver} driver)")

    def prepare(self, doc: dict[str, Any], clients: Clients) -> None:
        # before the pull: start() could not pass them (a document without env passes nothing)
        refuse_line_breaks({**doc.get("env", {}), **doc.get("trainer_env", {})})
        image = doc["image"]
        ecr = _ECR_IMAGE.match(image)
        present, why = self._verified_copy(image, ecr, clients)
        if present:
            log(f"image present, pull skipped: {image} ({why})")
            return
        if ecr:
            auth = _registry_client(ecr, clients).get_authorization_token(registryIds=[ecr.group(1)])
            password = base64.b64decode(auth["authorizationData"][0]["authorizationToken"]).decode().partition(":")[2]
            self._docker("login", "--username", "AWS", "--password-stdin", ecr.group(0), stdin=password)
        log(f"pulling {image}: {why}")
        started = time.monotonic()
        self._docker("pull", image)
        log(f"pulled {image} in {time.monotonic() - started:.1f}s")

    def _verified_copy(self, image: str, ecr: re.Match[str] | None, clients: Clients) -> tuple[bool, str]:
        """(True, why) when this host holds `image`, provably the one asked for (`images.py` says
        when); else (False, why it is pulled)."""
        ref = images.parse(image)
        if ref is None:
            return False, "not a plain image reference, so not checked on this host"
        try:
            local = self._docker_output("image", "inspect", "--format", images.INSPECT_DIGESTS, ref.local)
        except BootstrapError:
            return False, "not on this host"
        if ref.digest:
            return True, f"pinned by digest {ref.digest}"
        held = images.repo_digests(local, ref.name)
        if not held:
            return False, "the copy on this host has no registry digest to compare"
        if not ecr:
            return False, "a tag outside ECR is not checked against its registry"
        from botocore.exceptions import BotoCoreError, ClientError  # boto3 is there once an ECR client is

        try:
            answer = _registry_client(ecr, clients).batch_get_image(
                registryId=ecr.group(1),
                repositoryName=ref.repository,
                imageIds=[{"imageTag": ref.tag or "latest"}],
                acceptedMediaTypes=images.MANIFEST_TYPES,
            )
        except (BotoCoreError, ClientError) as exc:
            return False, f"cannot ask the registry what the tag names ({exc})"
        named = images.registry_digests(answer)
        if named & held:
            return True, f"the registry's tag names {min(named & held)}, as on this host"
        if not named:
            return False, "the registry has no image under this tag"
        return False, f"stale: the registry's tag names {min(named)}, this host has {', '.join(sorted(held))}"

    def outputs_folder(self) -> tuple[str, str]:
        """Owned by the image's user (WORKLOAD_UID), bind-mounted at OUTPUTS_IN_CONTAINER."""
        os.makedirs(HOST_DATA_DIR, exist_ok=True)
        folder = tempfile.mkdtemp(prefix="outputs-", dir=HOST_DATA_DIR)
        os.chown(folder, WORKLOAD_UID, WORKLOAD_UID)
        self.mounts.append(f"type=bind,src={folder},dst={OUTPUTS_IN_CONTAINER}")
        return folder, OUTPUTS_IN_CONTAINER

    def staging_folder(self, base: str | None) -> str:
        """A fresh folder under `base` (the instance store) or the root volume's data folder, owned by
        the image's user and bind-mounted at CHECKPOINTS_IN_CONTAINER."""
        parent = base or HOST_DATA_DIR
        os.makedirs(parent, exist_ok=True)
        folder = tempfile.mkdtemp(prefix="checkpoints-", dir=parent)
        os.chown(folder, WORKLOAD_UID, WORKLOAD_UID)
        self.mounts.append(f"type=bind,src={folder},dst={CHECKPOINTS_IN_CONTAINER}")
        return CHECKPOINTS_IN_CONTAINER

    def use_efa(self, devices: list[str]) -> None:
        """Give the container these EFA devices and an unlimited memlock (libfabric pins its buffers)."""
        self.devices = list(devices)

    def _docker(self, *args: str, stdin: str = "") -> None:
        self._docker_output(*args, stdin=stdin)

    def _docker_output(self, *args: str, stdin: str = "") -> str:
        try:
            done = subprocess.run([self.docker, *args], input=stdin.encode(), capture_output=True, check=False)
        except OSError as exc:
            raise BootstrapError(f"docker {args[0]} failed: {exc.strerror}") from None
        if done.returncode != 0:
            raise BootstrapError(f"docker {args[0]} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
        return done.stdout.decode(errors="replace")

    def start(self, doc: dict[str, Any], env: dict[str, str], private: dict[str, str] | None = None) -> None:
        self.name = container_name(doc["job_id"], doc["attempt"])
        if doc.get("keep_on_failure_seconds"):  # kept after a crash (`keep_for_inspection`), else removed then
            subprocess.run([self.docker, "rm", "--force", self.name], capture_output=True, check=False)
        argv = [self.docker, "run", *([] if doc.get("keep_on_failure_seconds") else ["--rm"]), "--name", self.name]
        argv += self._options(doc, workload=True)
        workload = {**env, **(private or {})}
        if workload:  # the only way the job's env reaches docker: never its argv or its environment
            self.env_file = EnvFile(workload)
            argv += ["--env-file", self.env_file.path]
        self._popen([*argv, doc["image"], *doc["command"]], dict(os.environ))

    def _options(self, doc: dict[str, Any], *, workload: bool) -> list[str]:
        """What the container is given and how it is confined: the workload's (with its stop timeout
        and log driver) and the one kept idle after a crash alike."""
        argv = ["--gpus", "all"] if doc["gpus_per_node"] > 0 else []
        argv += ["--network", "host", "--ipc", "host"]
        argv += ["--stop-timeout", str(doc["stop_timeout_seconds"])] if workload else []
        argv += ["--user", f"{self.user}:{self.user}", *confinement.OPTIONS]
        argv += ["--cgroup-parent", self.cgroup_parent] if self.cgroup_parent else []
        if self.devices:
            argv += ["--ulimit", "memlock=-1:-1", *(f"--device={device}" for device in self.devices)]
        argv += self.log_options if workload else []
        for mount in self.mounts:
            argv += ["--mount", mount]
        return argv

    def keep_for_inspection(self, doc: dict[str, Any]) -> bool:
        """The crashed container's filesystem, committed to an image and run idle (`sleep infinity`)
        under the same name, confined and mounted as the workload was but with none of its env or
        secrets, for `gpujobs shell`/`exec` (docker cannot change a container's command)."""
        image = f"gpujobs-kept/{self.name}:latest"
        try:
            self._docker("commit", self.name, image)
            self._docker("rm", self.name)
            idle = ["--entrypoint", "sleep", image, "infinity"]
            self._docker("run", "--detach", "--name", self.name, *self._options(doc, workload=False), *idle)
        except BootstrapError as exc:
            log(f"the crashed container cannot be kept: {exc}")
            return False
        log(f"the crashed container's filesystem is kept, idle, as {self.name}")
        return True

    def send_output_to(self, *, group: str, stream: str, region: str, clients: Clients) -> None:
        del clients  # the daemon writes with the instance role's credentials
        options = [f"awslogs-region={region}", f"awslogs-group={group}", f"awslogs-stream={stream}"]
        options += ["mode=non-blocking", "max-buffer-size=16m"]
        self.log_options = ["--log-driver", "awslogs", *(a for o in options for a in ("--log-opt", o))]

    def wait(self) -> int:
        try:
            return super().wait()
        finally:
            if self.env_file is not None:
                self.env_file.close()

    def stop(self, signum: int, timeout: int) -> None:
        del signum  # docker stop sends the image's STOPSIGNAL, then SIGKILL after the timeout
        argv = [self.docker, "stop", "-t", str(timeout), self.name]
        threading.Thread(target=subprocess.run, args=(argv,), kwargs={"check": False}, daemon=True).start()
