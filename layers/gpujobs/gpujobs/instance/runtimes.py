"""The container runtimes: how the workload is started, waited for and stopped.

`docker` runs on EC2 (ECR login with the password on stdin, pull, `docker run`); `process` runs the
command as a local process (the local cloud, tests). Both start from an argv list, never a shell,
and `docker run` gets env names only (`-e NAME`), the values through its environment, so no job
string is parsed by a shell or shown by `ps`. What is private (secret values, the credentials
token) goes neither there nor on argv: docker reads it from a 0600 `--env-file`, a process gets it
in its own environment only. Devices and mounts for the container belong in `DockerRuntime.start`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from typing import Any

from gpujobs.instance.aws import Clients
from gpujobs.instance.cloudwatch_agent import cloudwatch_agent_installed, start_cloudwatch_agent
from gpujobs.instance.contract import container_name
from gpujobs.instance.errors import BootstrapError
from gpujobs.instance.job_secrets import EnvFile

_ECR_IMAGE = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?(?=/)")


class Runtime:
    """Runs one workload: `prepare` (may fail the bootstrap), `start`, `wait` -> exit code, `stop`."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.unstarted = 0  # 127/126: the command was not found/not executable (no `proc`)
        self.error_line = ""  # why the workload ended, when known: the exit report carries it

    def prepare(self, doc: dict[str, Any], clients: Clients) -> None:
        """Nothing to fetch by default."""

    def start(self, doc: dict[str, Any], env: dict[str, str], private: dict[str, str] | None = None) -> None:
        """Start the workload with `env` and `private` (values that must stay off argv and logs)."""
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
        argv = [*self.entrypoint, *doc["command"]]
        try:
            self.proc = subprocess.Popen(argv, env=full, stdin=subprocess.DEVNULL, start_new_session=True)
        except (FileNotFoundError, PermissionError) as exc:  # the workload's exit, as docker or a shell reports it
            self.unstarted = 127 if isinstance(exc, FileNotFoundError) else 126
            self.error_line = f"{argv[0]}: {exc.strerror}"

    def wait(self) -> int:
        return self.unstarted or super().wait()

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
        self.user: int | None = None
        self.env_file: EnvFile | None = None

    def block_imds(self, uid: int, iptables: str = "iptables") -> None:
        """Refuse the instance metadata service to `uid`, and run the container as that uid.

        With `--network host` the container's packets leave from the host's own network namespace,
        so the hop limit does not stop them; an `owner` rule in OUTPUT does. Failing to install it
        fails the bootstrap: the container would otherwise reach the instance role.
        """
        rule = ["OUTPUT", "-d", "169.254.169.254", "-m", "owner", "--uid-owner", str(uid), "-j", "REJECT"]
        binary = shutil.which(iptables) or iptables
        present = subprocess.run([binary, "-C", *rule], capture_output=True, check=False)
        if present.returncode != 0:
            done = subprocess.run([binary, "-I", *rule], capture_output=True, check=False)
            if done.returncode != 0:
                raise BootstrapError(f"cannot block IMDS for uid {uid}: {done.stderr.decode()[-300:]}")
        self.user = uid

    def prepare(self, doc: dict[str, Any], clients: Clients) -> None:
        image = doc["image"]
        ecr = _ECR_IMAGE.match(image)
        if ecr:
            auth = clients("ecr").get_authorization_token(registryIds=[ecr.group(1)])["authorizationData"][0]
            password = base64.b64decode(auth["authorizationToken"]).decode().partition(":")[2]
            self._docker("login", "--username", "AWS", "--password-stdin", ecr.group(0), stdin=password)
        self._docker("pull", image)
        if doc["gpus_per_node"] > 0 and cloudwatch_agent_installed():
            start_cloudwatch_agent()

    def _docker(self, *args: str, stdin: str = "") -> None:
        done = subprocess.run([self.docker, *args], input=stdin.encode(), capture_output=True, check=False)
        if done.returncode != 0:
            raise BootstrapError(f"docker {args[0]} failed ({done.returncode}): {done.stderr.decode()[-500:]}")

    def start(self, doc: dict[str, Any], env: dict[str, str], private: dict[str, str] | None = None) -> None:
        self.name = container_name(doc["job_id"], doc["attempt"])
        argv = [self.docker, "run", "--rm", "--name", self.name]
        argv += ["--gpus", "all"] if doc["gpus_per_node"] > 0 else []
        argv += ["--network", "host", "--ipc", "host", "--stop-timeout", str(doc["stop_timeout_seconds"])]
        argv += ["--user", f"{self.user}:{self.user}"] if self.user is not None else []
        if private:
            self.env_file = EnvFile(private)
            argv += ["--env-file", self.env_file.path]
        for key in sorted(env):
            argv += ["-e", key]  # the value comes from this process's environment, never argv
        self.proc = subprocess.Popen(
            [*argv, doc["image"], *doc["command"]], env={**os.environ, **env}, stdin=subprocess.DEVNULL
        )

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
