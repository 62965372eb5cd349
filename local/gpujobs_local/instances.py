"""EC2 instances brought to life: every instance moto launches for the stack runs the real bootstrap.

``InstanceRunner.poll()`` (called every ~0.2 s on the local cloud's loop thread) watches
``describe_instances`` for instances tagged ``gpujobs:stack=<stack>``. For each new one it starts a
fake IMDSv2 (its instance id, launch index, ``local-ipv4`` 127.0.0.1, region, user data read back
from moto), emits ``EC2 Instance State-change Notification`` ``running``, and spawns
``python -m gpujobs.instance.bootstrap --runtime process`` in its own session with a fresh local disk
(``TMPDIR`` under ``workdir/instances/<id>/``, which the trainer also uses for its checkpoint
staging). What EC2 would do to the machine follows moto's state and the runner's own methods:

* the control plane terminates (or stops) it: SIGTERM to the bootstrap, which forwards it to the
  workload; SIGKILL to everything the instance runs after ``grace_seconds``; ``shutting-down`` then
  ``terminated`` (``stopping`` then ``stopped``) events;
* the bootstrap exits by itself (the job ended; a real instance powers off and the launch template
  terminates it): ``terminate_instances`` in moto and ``shutting-down`` + ``terminated`` events;
* ``interrupt_spot``: IMDS ``spot/instance-action``, the interruption warning event, and the
  termination ``notice_seconds`` later; ``rebalance``: IMDS notice and the recommendation event;
* ``crash``: everything SIGKILLed at once, terminated, events, and no ``Job Exited``.

The processes of an instance are found by their environment (``TMPDIR`` is the instance's own
directory; the bootstrap passes it through to the workload and torchrun passes it to its workers),
because the workload and torchrun's workers each start their own session. ``poll()`` never waits:
deadlines are kept and checked on later polls.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpujobs_local.imds import FakeImds

log = logging.getLogger("gpujobs_local.instances")

TAG_STACK, TAG_JOB_ID, TAG_ATTEMPT = "gpujobs:stack", "gpujobs:job-id", "gpujobs:attempt"
STATE_CHANGE = "EC2 Instance State-change Notification"
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
EC2_SOURCE = "aws.ec2"
PR_SET_CHILD_SUBREAPER = 36
_ENDING = {"shutting-down": "terminated", "terminated": "terminated", "stopping": "stopped", "stopped": "stopped"}


def _utc(seconds_from_now: float = 0.0) -> str:
    moment = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds_from_now)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick for an ephemeral bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def become_subreaper() -> bool:
    """Orphans of our descendants become our children (Linux), so we can reap them.

    A killed instance's processes are orphaned at once (their parents die with them). Without this, init
    must reap them, and until it does they are zombies that ``os.killpg(pgid, 0)`` still finds; in a
    container init may never reap them. Process-wide: ``_reap`` only waits for pids of our instances.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _proc_state(pid: int) -> tuple[str, int]:
    """(state letter R, S, Z, ..., parent pid), or ("", 0) when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", 0
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def processes_with_env(name: str, value: str, proc_root: Path = Path("/proc")) -> dict[int, int]:
    """pid -> pgid of every live process of ours whose environment has ``name=value``."""
    wanted = f"{name}={value}".encode()
    found: dict[int, int] = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone, or not ours
        if stat[stat.rfind(")") + 2 :].startswith("Z"):
            continue  # a zombie is already dead; its parent reaps it
        if wanted in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError):
                found[pid] = os.getpgid(pid)
    return found


@dataclass
class LocalInstance:
    """One EC2 instance as this host runs it."""

    instance_id: str
    launch_index: int
    job_id: str
    attempt: int | None
    directory: Path
    imds: FakeImds
    arn: str
    proc: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None
    state: str = "pending"  # what this runner last emitted
    exit_code: int | None = None  # the bootstrap's own exit code (None while it runs or if killed by us)
    crashed: bool = False
    ending: str = ""  # "terminated" or "stopped" once the control plane ended it
    kill_at: float | None = None  # monotonic deadline for SIGKILL after SIGTERM
    terminate_at: float | None = None  # monotonic time a spot interruption takes effect
    terminate_on_finish: bool = False  # reclaimed by "EC2": stays shutting-down until its processes are gone
    pgids: set[int] = field(default_factory=set)  # every process group seen running for this instance
    pids: set[int] = field(default_factory=set)  # every process seen (orphans become ours to reap)

    @property
    def log_path(self) -> Path:
        return self.directory / "bootstrap.log"

    @property
    def tmpdir(self) -> Path:
        return self.directory / "tmp"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class InstanceRunner:
    """Runs every instance moto launches for the stack as local processes (see the module docstring)."""

    def __init__(
        self,
        *,
        ec2: Any,
        stack_name: str,
        emit: Callable[..., None],
        workdir: Path,
        env: Mapping[str, str],
        grace_seconds: float = 10.0,
        python: str = sys.executable,
        entrypoint: str | None = None,
        bootstrap_args: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        """``entrypoint``: the process runtime's argv prefix (default: the trainer's launcher; "" runs the
        job's command directly). ``bootstrap_args``: extra bootstrap options (e.g. ``--wait-timeout 20``).
        """
        self.ec2 = ec2
        self.stack_name = stack_name
        self.emit = emit
        self.workdir = Path(workdir)
        self.env = dict(env)
        self.grace_seconds = grace_seconds
        self.python = python
        self.entrypoint = f"{shlex.quote(python)} -m gpujobs_trainer.launch --" if entrypoint is None else entrypoint
        self.bootstrap_args = list(bootstrap_args)
        self.cwd = cwd
        self.region: str = ec2.meta.region_name
        self.instances: dict[str, LocalInstance] = {}
        self.ports: dict[tuple[str, int | None], int] = {}  # (job, attempt) -> the master port on 127.0.0.1
        self._lock = threading.RLock()
        self._outbox: list[dict[str, Any]] = []
        self._stopped = False
        self.subreaper = become_subreaper()

    # --- public API ------------------------------------------------------------------------------

    def log_path(self, instance_id: str) -> Path:
        return self.workdir / "instances" / instance_id / "bootstrap.log"

    def poll(self) -> None:
        """One look at EC2 and at the processes; never waits."""
        try:
            with self._lock:
                if not self._stopped:
                    self._poll()
        finally:
            self._flush()

    def interrupt_spot(self, instance_id: str, *, notice_seconds: float) -> None:
        """The spot notice: IMDS instance-action, the warning event, termination after ``notice_seconds``."""
        with self._lock:
            inst = self.instances[instance_id]
            inst.imds.announce_termination(time=_utc(notice_seconds))
            inst.terminate_at = time.monotonic() + notice_seconds
            self._event(SPOT_WARNING, {"instance-id": instance_id, "instance-action": "terminate"}, inst)
        self._flush()

    def rebalance(self, instance_id: str) -> None:
        with self._lock:
            inst = self.instances[instance_id]
            inst.imds.recommend_rebalance(notice_time=_utc())
            self._event(REBALANCE, {"instance-id": instance_id}, inst)
        self._flush()

    def crash(self, instance_id: str) -> None:
        """The machine dies: everything SIGKILLed, the instance terminated, state events, no Job Exited."""
        with self._lock:
            inst = self.instances[instance_id]
            inst.crashed = True
            inst.terminate_at = None
            self._kill(inst, signal.SIGKILL)
            if inst.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    inst.proc.wait(timeout=5)  # SIGKILL is immediate: reap the bootstrap
            self._terminate_in_ec2(inst)
            if inst.state not in ("shutting-down", "terminated"):
                self._state(inst, "shutting-down")
            inst.ending = "terminated"
            self._finish(inst)
            self._reap(inst, timeout=5.0)
        self._flush()

    def stop_all(self, timeout: float | None = None) -> None:
        """SIGTERM every instance's processes, SIGKILL what is left after ``timeout`` (default the grace);
        stop the fake IMDS servers. Idempotent; emits nothing and leaves moto alone."""
        with self._lock:
            self._stopped = True
            instances = list(self.instances.values())
            for inst in instances:
                if inst.alive:
                    self._signal_bootstrap(inst, signal.SIGTERM)
            deadline = time.monotonic() + (self.grace_seconds if timeout is None else timeout)
            while any(inst.alive for inst in instances) and time.monotonic() < deadline:
                time.sleep(0.05)
            for _ in range(3):  # processes may fork while being killed
                for inst in instances:
                    self._kill(inst, signal.SIGKILL)
                if not any(self._processes(inst) for inst in instances):
                    break
                time.sleep(0.05)
            for inst in instances:
                if inst.proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        inst.proc.wait(timeout=5)
                self._reap(inst, timeout=5.0)
                self._close(inst)

    def process_groups(self) -> set[int]:
        """Every process group any instance was seen running (for checks that nothing is left)."""
        with self._lock:
            return {pgid for inst in self.instances.values() for pgid in inst.pgids}

    # --- the loop ---------------------------------------------------------------------------------

    def _poll(self) -> None:
        for described in self._describe():
            iid, state = described["InstanceId"], described["State"]["Name"]
            inst = self.instances.get(iid)
            if inst is None:
                if state in ("pending", "running"):
                    self._launch(described)
                continue
            if state in _ENDING and not inst.ending and not inst.crashed:
                self._end(inst, _ENDING[state])
        now = time.monotonic()
        for inst in self.instances.values():
            if inst.crashed or inst.state in ("terminated", "stopped"):
                self._reap(inst)
                continue
            if inst.alive:
                self._track(inst, self._processes(inst))
            if inst.terminate_at is not None and now >= inst.terminate_at and not inst.ending:
                # As on EC2, the instance is shutting-down while its workload gets SIGTERM and the grace;
                # it reads terminated only once nothing of it runs (a replacement waits for that).
                inst.terminate_at = None
                inst.terminate_on_finish = True
                self._end(inst, "terminated")
            if inst.kill_at is not None and now >= inst.kill_at:
                inst.kill_at = None
                log.info("%s: still running %.0fs after SIGTERM; SIGKILL", inst.instance_id, self.grace_seconds)
                self._kill(inst, signal.SIGKILL)
            if inst.proc is not None and inst.proc.poll() is not None:
                self._exited(inst)

    def _describe(self) -> Iterator[dict[str, Any]]:
        filters = [{"Name": f"tag:{TAG_STACK}", "Values": [self.stack_name]}]
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for described in reservation["Instances"]:
                    described.setdefault("OwnerId", reservation.get("OwnerId", "123456789012"))
                    yield described

    def _launch(self, described: dict[str, Any]) -> None:
        iid = described["InstanceId"]
        tags = {t["Key"]: t["Value"] for t in described.get("Tags", [])}
        attempt_tag = tags.get(TAG_ATTEMPT, "")
        attempt = int(attempt_tag) if attempt_tag.isdigit() else None
        directory = self.workdir / "instances" / iid
        (directory / "tmp").mkdir(parents=True, exist_ok=True)
        imds = FakeImds(
            metadata={
                "instance-id": iid,
                "ami-launch-index": str(described.get("AmiLaunchIndex", 0)),
                "local-ipv4": "127.0.0.1",
                "placement/region": self.region,
                "placement/availability-zone": described.get("Placement", {}).get("AvailabilityZone", ""),
                "instance-type": described.get("InstanceType", ""),
            },
            user_data=self._user_data(iid),
        ).start()
        inst = LocalInstance(
            instance_id=iid,
            launch_index=int(described.get("AmiLaunchIndex", 0)),
            job_id=tags.get(TAG_JOB_ID, ""),
            attempt=attempt,
            directory=directory,
            imds=imds,
            arn=f"arn:aws:ec2:{self.region}:{described['OwnerId']}:instance/{iid}",
        )
        self.instances[iid] = inst
        self._state(inst, "running")
        port = self.ports.setdefault((inst.job_id or iid, attempt), free_port())
        argv = [self.python, "-m", "gpujobs.instance.bootstrap", "--runtime", "process", "--no-shutdown"]
        if self.entrypoint:
            argv += ["--entrypoint", self.entrypoint]
        argv += ["--master-addr", "127.0.0.1", "--master-port", str(port), *self.bootstrap_args]
        env = {
            **self.env,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
            "TMPDIR": str(inst.tmpdir),
            "PYTHONUNBUFFERED": "1",
        }
        inst.log_file = inst.log_path.open("ab")
        inst.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=inst.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.cwd or directory,
        )
        inst.pgids.add(inst.proc.pid)
        log.info("%s: bootstrap pid %d, IMDS %s, log %s", iid, inst.proc.pid, imds.endpoint, inst.log_path)

    def _user_data(self, instance_id: str) -> bytes | None:
        try:
            value = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        except Exception as exc:  # the instance can still boot; the bootstrap reports the missing document
            log.warning("%s: cannot read user data: %s", instance_id, exc)
            return None
        encoded = value.get("UserData", {}).get("Value")
        return base64.b64decode(encoded) if encoded else None

    def _end(self, inst: LocalInstance, ending: str) -> None:
        """The control plane (or the spot service) ended the instance: SIGTERM now, SIGKILL after the grace."""
        inst.ending = ending
        self._state(inst, "shutting-down" if ending == "terminated" else "stopping")
        if inst.alive:
            self._signal_bootstrap(inst, signal.SIGTERM)
            inst.kill_at = time.monotonic() + self.grace_seconds
        else:
            self._finish(inst)

    def _exited(self, inst: LocalInstance) -> None:
        assert inst.proc is not None
        inst.exit_code = inst.proc.returncode
        if not inst.ending:  # the job is over: the instance powers off and terminates
            log.info("%s: bootstrap exited %d; terminating the instance", inst.instance_id, inst.exit_code)
            self._terminate_in_ec2(inst)
            inst.ending = "terminated"
            self._state(inst, "shutting-down")
        self._finish(inst)

    def _finish(self, inst: LocalInstance) -> None:
        """The machine is off: nothing of it runs any more, and EC2 says so."""
        self._kill(inst, signal.SIGKILL)
        inst.kill_at = inst.terminate_at = None
        if inst.terminate_on_finish:
            inst.terminate_on_finish = False
            self._terminate_in_ec2(inst)
        self._close(inst)
        self._state(inst, inst.ending or "terminated")

    def _terminate_in_ec2(self, inst: LocalInstance) -> None:
        try:
            self.ec2.terminate_instances(InstanceIds=[inst.instance_id])
        except Exception as exc:  # already gone, or moto is shutting down
            log.warning("%s: terminate_instances failed: %s", inst.instance_id, exc)

    # --- processes -------------------------------------------------------------------------------

    def _processes(self, inst: LocalInstance) -> dict[int, int]:
        found = processes_with_env("TMPDIR", str(inst.tmpdir))
        if inst.alive and inst.proc is not None:
            found[inst.proc.pid] = inst.proc.pid  # the bootstrap leads its own group
        return found

    def signal_container(self, instance_id: str, signum: int) -> bool:
        """What `docker kill --signal` does on EC2: signal the workload's first process (the container's
        PID 1, the trainer's launcher), which is the bootstrap's child here. False if it is not running."""
        inst = self.instances.get(instance_id)
        if inst is None or inst.proc is None or not inst.alive:
            return False
        children = [pid for pid in self._processes(inst) if _proc_state(pid)[1] == inst.proc.pid]
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        return bool(children)

    def _signal_bootstrap(self, inst: LocalInstance, signum: int) -> None:
        """SIGTERM to the bootstrap's group: the bootstrap forwards it to the workload, as on EC2."""
        if inst.proc is not None and inst.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(inst.proc.pid, signum)

    def _track(self, inst: LocalInstance, processes: dict[int, int]) -> None:
        inst.pids.update(processes)
        inst.pgids.update(processes.values())

    def _reap(self, inst: LocalInstance, timeout: float = 0.0) -> None:
        """Collect the exit status of orphans handed to us (see ``become_subreaper``); never blocks past ``timeout``."""
        deadline = time.monotonic() + timeout
        bootstrap = inst.proc.pid if inst.proc is not None else -1
        while True:
            waiting = False
            for pid in sorted(inst.pids - {bootstrap}):  # Popen reaps the bootstrap, its own child
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not ours (yet): gone, alive, or a zombie whose parent is dying
                    state, parent = _proc_state(pid)
                    if not state or (state == "Z" and parent not in inst.pids):
                        inst.pids.discard(pid)  # gone, or someone else's to reap
                    else:
                        waiting = True  # its parent is one of ours: it is handed to us when that dies
                    continue
                if done:
                    inst.pids.discard(pid)
                else:
                    waiting = True
            if not waiting or time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def _kill(self, inst: LocalInstance, signum: int) -> None:
        processes = self._processes(inst)
        self._track(inst, processes)
        for pgid in set(processes.values()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signum)
        for pid in processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def _close(self, inst: LocalInstance) -> None:
        inst.imds.close()
        if inst.log_file is not None:
            inst.log_file.close()
            inst.log_file = None

    # --- events ----------------------------------------------------------------------------------

    def _state(self, inst: LocalInstance, state: str) -> None:
        if inst.state == state:
            return
        inst.state = state
        self._event(STATE_CHANGE, {"instance-id": inst.instance_id, "state": state}, inst)

    def _event(self, detail_type: str, detail: dict[str, Any], inst: LocalInstance) -> None:
        self._outbox.append(
            {"source": EC2_SOURCE, "detail_type": detail_type, "detail": detail, "resources": [inst.arn]}
        )

    def _flush(self) -> None:
        """Emit outside the lock: a handler reacting to the event may call back into EC2 (or this runner)."""
        with self._lock:
            events, self._outbox = self._outbox, []
        for event in events:
            try:
                self.emit(**event)
            except Exception:  # one failed delivery must not stop the machines
                log.exception("emitting %s failed", event["detail_type"])
