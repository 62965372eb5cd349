"""EC2 instances brought to life: every instance moto launches for the stack runs the real bootstrap.

``InstanceRunner.poll()`` (called every ~0.2 s on the local cloud's loop thread) watches
``describe_instances`` for instances tagged ``gpujobs:stack=<stack>``. For each new one it starts a
fake IMDSv2 (its instance id, launch index, ``local-ipv4`` 127.0.0.1, region, user data read back
from moto), emits ``EC2 Instance State-change Notification`` ``running``, and spawns the bootstrap
(``--runtime process``) in its own session with a fresh local disk (``TMPDIR`` under
``workdir/instances/<id>/``). It runs the bundle an instance's loader runs, unpacked under
``workdir/bootstrap/``, with ``instance_python``: the AMI's python3 (3.9 on Amazon Linux 2023, 3.10
on the Ubuntu 22.04 DLAMI; it needs only boto3), or by default this one. The workload is not the
bootstrap's: the container (``--engine``) and the trainer run with ``python``, the image's here. With ``images=True`` (the local cloud's own runner)
the job runs as its image would: the bootstrap starts ``python -m gpujobs_local.container --root
workdir/instances/<id>/rootfs IMAGE COMMAND...`` (``container``), which lays the image's tree there
and execs its entrypoint, so the image's own paths (the trainer's checkpoint staging folder among
them) are on that instance's disk. What EC2 would do to the machine follows moto's state and the
runner's own methods:

* the control plane terminates (or stops) it: SIGTERM to the bootstrap, which forwards it to the
  workload; SIGKILL to everything the instance runs after ``grace_seconds``; ``shutting-down`` then
  ``terminated`` (``stopping`` then ``stopped``) events;
* the bootstrap exits by itself (the job ended; a real instance powers off and the launch template
  terminates it): ``terminate_instances`` in moto and ``shutting-down`` + ``terminated`` events;
* ``interrupt_spot``: IMDS ``spot/instance-action``, the interruption warning event, and the
  termination ``notice_seconds`` later; ``rebalance``: IMDS notice and the recommendation event;
* ``crash``: everything SIGKILLed at once, terminated, events, and no ``Job Exited``;
* ``boots_held()``: instances launched inside the block boot only when it ends, as a machine still
  being provisioned (a story can act between a launch and the boot).

This module keeps EC2's side (what moto says, the state a machine is in, the events EC2 emits);
running, finding, signalling and reaping an instance's processes is ``processes.InstanceProcesses``.
``poll()`` never waits: deadlines are kept and checked on later polls.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpujobs.contract import (
    ATTEMPT_TAG,
    EC2_SOURCE,
    INSTANCE_STATE_CHANGE,
    JOB_TAG,
    LIVE_STATES,
    REBALANCE_RECOMMENDATION,
    SPOT_INTERRUPTION_WARNING,
    STACK_TAG,
    UP_STATES,
    WORKLOAD_MAY_RUN_STATES,
)
from gpujobs.instance.userdata import bootstrap_command, unpack_bootstrap
from gpujobs_local.imds import FakeImds, instance_role_metadata
from gpujobs_local.processes import InstanceProcesses, become_subreaper, free_port

log = logging.getLogger("gpujobs_local.instances")

STATE_CHANGE = INSTANCE_STATE_CHANGE
SPOT_WARNING = SPOT_INTERRUPTION_WARNING
REBALANCE = REBALANCE_RECOMMENDATION
_ENDING = {"shutting-down": "terminated", "terminated": "terminated", "stopping": "stopped", "stopped": "stopped"}
_KEYS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"}
"""The host's credentials, which an instance given its own instance-role session does not get."""
_PROBE = "import sys, boto3; print('%d.%d.%d' % sys.version_info[:3]); sys.exit(sys.version_info < (3, 9))"


def instance_python_version(python: str) -> str:
    """The version of `python`, which must be what the bootstrap needs on an AMI: Python 3.9+ with
    boto3. ValueError naming the interpreter and what it lacks otherwise."""
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"instance python {python!r} cannot be run: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"Python {done.stdout.strip()}"])[-1]
        raise ValueError(f"instance python {python!r} is not a Python 3.9 or newer with boto3: {said}")
    return done.stdout.strip()


def _utc(seconds_from_now: float = 0.0) -> str:
    moment = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds_from_now)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


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
    state: str = "pending"  # what this runner last emitted
    exit_code: int | None = None  # the bootstrap's own exit code (None while it runs or if killed by us)
    crashed: bool = False
    ending: str = ""  # "terminated" or "stopped" once the control plane ended it
    kill_at: float | None = None  # monotonic deadline for SIGKILL after SIGTERM
    terminate_at: float | None = None  # monotonic time a spot interruption takes effect
    terminate_on_finish: bool = False  # reclaimed by "EC2": stays shutting-down until its processes are gone
    processes: InstanceProcesses = field(init=False)

    def __post_init__(self) -> None:
        self.processes = InstanceProcesses(tmpdir=self.tmpdir)

    @property
    def log_path(self) -> Path:
        return self.directory / "bootstrap.log"

    @property
    def tmpdir(self) -> Path:
        return self.directory / "tmp"

    @property
    def alive(self) -> bool:
        """The bootstrap runs."""
        return self.processes.alive

    @property
    def pgids(self) -> set[int]:
        """Every process group seen running for this instance."""
        return self.processes.pgids


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
        instance_python: str | None = None,
        entrypoint: str | None = None,
        images: bool = False,
        bootstrap_args: Sequence[str] = (),
        cwd: Path | None = None,
        instance_credentials: Callable[[str], Mapping[str, Any]] | None = None,
        instance_role_name: str = "",
    ) -> None:
        """``entrypoint``: the process runtime's argv prefix (default: the trainer's launcher; "" runs the
        job's command directly). ``images``: run each job in its image instead (``container``; the
        entrypoint is then the image's). ``bootstrap_args``: extra bootstrap options (e.g. ``--wait-timeout 20``).
        ``instance_python``: the bootstrap's interpreter (default ``python``); checked now (ValueError).
        ``instance_credentials``: instance id -> its instance-role session (STS ``Credentials``,
        ``MotoStack.instance_credentials``), served by its IMDS under ``iam/security-credentials/``
        ``instance_role_name`` as EC2 does; the bootstrap then gets no keys of ``env``'s.
        """
        self.ec2 = ec2
        self.stack_name = stack_name
        self.emit = emit
        self.workdir = Path(workdir)
        self.env = dict(env)
        self.grace_seconds = grace_seconds
        self.python = python
        self.instance_python = python if instance_python is None else instance_python
        self.instance_python_version = instance_python_version(self.instance_python) if instance_python else ""
        self.bundle = unpack_bootstrap(self.workdir / "bootstrap")
        self.entrypoint = f"{shlex.quote(python)} -m gpujobs_trainer.launch --" if entrypoint is None else entrypoint
        self.images = images
        self.bootstrap_args = list(bootstrap_args)
        self.cwd = cwd
        self.instance_credentials = instance_credentials
        self.instance_role_name = instance_role_name or "gpujobs-instance-role"
        self.region: str = ec2.meta.region_name
        self.instances: dict[str, LocalInstance] = {}
        self.ports: dict[tuple[str, int | None], int] = {}  # (job, attempt) -> the master port on 127.0.0.1
        self._lock = threading.RLock()
        self._outbox: list[dict[str, Any]] = []
        self._stopped = False
        self._boots_held = False
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
            inst.processes.kill(signal.SIGKILL)
            inst.processes.wait_bootstrap(timeout=5)  # SIGKILL is immediate: reap the bootstrap
            self._terminate_in_ec2(inst)
            if inst.state in LIVE_STATES:
                self._state(inst, "shutting-down")
            inst.ending = "terminated"
            self._finish(inst)
            inst.processes.reap(timeout=5.0)
        self._flush()

    def stop_all(self, timeout: float | None = None) -> None:
        """SIGTERM every instance's processes, SIGKILL what is left after ``timeout`` (default the grace);
        stop the fake IMDS servers. Idempotent; emits nothing and leaves moto alone."""
        with self._lock:
            self._stopped = True
            instances = list(self.instances.values())
            for inst in instances:
                inst.processes.signal_bootstrap(signal.SIGTERM)
            deadline = time.monotonic() + (self.grace_seconds if timeout is None else timeout)
            while any(inst.alive for inst in instances) and time.monotonic() < deadline:
                time.sleep(0.05)
            for _ in range(3):  # processes may fork while being killed
                for inst in instances:
                    inst.processes.kill(signal.SIGKILL)
                if not any(inst.processes.running() for inst in instances):
                    break
                time.sleep(0.05)
            for inst in instances:
                inst.processes.wait_bootstrap(timeout=5)
                inst.processes.reap(timeout=5.0)
                self._close(inst)

    @contextmanager
    def boots_held(self) -> Iterator[None]:
        """Instances launched inside the block start their bootstrap only when it ends."""
        with self._lock:
            self._boots_held = True
        try:
            yield
        finally:
            with self._lock:
                self._boots_held = False

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
                if state in UP_STATES and not self._boots_held:
                    self._launch(described)
                continue
            if state in _ENDING and not inst.ending and not inst.crashed:
                self._end(inst, _ENDING[state])
        now = time.monotonic()
        for inst in self.instances.values():
            if inst.crashed or inst.state not in WORKLOAD_MAY_RUN_STATES:
                inst.processes.reap()
                continue
            if inst.alive:
                inst.processes.track()
            if inst.terminate_at is not None and now >= inst.terminate_at and not inst.ending:
                # As on EC2, the instance is shutting-down while its workload gets SIGTERM and the grace;
                # it reads terminated only once nothing of it runs (a replacement waits for that).
                inst.terminate_at = None
                inst.terminate_on_finish = True
                self._end(inst, "terminated")
            if inst.kill_at is not None and now >= inst.kill_at:
                inst.kill_at = None
                log.info("%s: still running %.0fs after SIGTERM; SIGKILL", inst.instance_id, self.grace_seconds)
                inst.processes.kill(signal.SIGKILL)
            if inst.processes.exited:
                self._exited(inst)

    def _describe(self) -> Iterator[dict[str, Any]]:
        filters = [{"Name": f"tag:{STACK_TAG}", "Values": [self.stack_name]}]
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for described in reservation["Instances"]:
                    described.setdefault("OwnerId", reservation.get("OwnerId", "123456789012"))
                    yield described

    def _launch(self, described: dict[str, Any]) -> None:
        iid = described["InstanceId"]
        tags = {t["Key"]: t["Value"] for t in described.get("Tags", [])}
        attempt_tag = tags.get(ATTEMPT_TAG, "")
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
                **self._role_metadata(iid),
            },
            user_data=self._user_data(iid),
        ).start()
        inst = LocalInstance(
            instance_id=iid,
            launch_index=int(described.get("AmiLaunchIndex", 0)),
            job_id=tags.get(JOB_TAG, ""),
            attempt=attempt,
            directory=directory,
            imds=imds,
            arn=f"arn:aws:ec2:{self.region}:{described['OwnerId']}:instance/{iid}",
        )
        self.instances[iid] = inst
        self._state(inst, "running")
        port = self.ports.setdefault((inst.job_id or iid, attempt), free_port())
        argv = [*bootstrap_command(self.instance_python, self.bundle), "--runtime", "process", "--no-shutdown"]
        if self.images:
            rootfs = shlex.quote(str(directory / "rootfs"))
            argv += ["--engine", f"{shlex.quote(self.python)} -m gpujobs_local.container --root {rootfs}"]
        elif self.entrypoint:
            argv += ["--entrypoint", self.entrypoint]
        argv += ["--master-addr", "127.0.0.1", "--master-port", str(port), *self.bootstrap_args]
        env = {
            **{k: v for k, v in self.env.items() if self.instance_credentials is None or k not in _KEYS},
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
            "TMPDIR": str(inst.tmpdir),
            "PYTHONUNBUFFERED": "1",
        }
        pid = inst.processes.spawn(argv, env=env, cwd=self.cwd or directory, log_path=inst.log_path)
        log.info("%s: bootstrap pid %d, IMDS %s, log %s", iid, pid, imds.endpoint, inst.log_path)

    def _role_metadata(self, instance_id: str) -> dict[str, str]:
        """The instance profile's credentials as its IMDS serves them (none without ``instance_credentials``)."""
        if self.instance_credentials is None:
            return {}
        return instance_role_metadata(self.instance_role_name, self.instance_credentials(instance_id))

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
            inst.processes.signal_bootstrap(signal.SIGTERM)
            inst.kill_at = time.monotonic() + self.grace_seconds
        else:
            self._finish(inst)

    def _exited(self, inst: LocalInstance) -> None:
        assert inst.processes.proc is not None
        inst.exit_code = inst.processes.proc.returncode
        if not inst.ending:  # the job is over: the instance powers off and terminates
            log.info("%s: bootstrap exited %d; terminating the instance", inst.instance_id, inst.exit_code)
            self._terminate_in_ec2(inst)
            inst.ending = "terminated"
            self._state(inst, "shutting-down")
        self._finish(inst)

    def _finish(self, inst: LocalInstance) -> None:
        """The machine is off: nothing of it runs any more, and EC2 says so."""
        inst.processes.kill(signal.SIGKILL)
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

    def signal_container(self, instance_id: str, signum: int) -> bool:
        """What `docker kill --signal` does on EC2: signal the workload's first process (the container's
        PID 1, the trainer's launcher), which is the bootstrap's child here. False if it is not running."""
        inst = self.instances.get(instance_id)
        return inst is not None and inst.processes.signal_workload(signum)

    def _close(self, inst: LocalInstance) -> None:
        inst.imds.close()
        inst.processes.close_log()

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
