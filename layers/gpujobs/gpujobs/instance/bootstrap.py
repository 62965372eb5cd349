"""gpujobs instance bootstrap: the one fixed program every training instance runs.

The shell part of the user data is the same bytes for every job: it carries this package, bundled,
and runs it with python3. Everything job-specific is JSON (the run document), read here as data.
Every child process starts from an argv list, never a shell, and env values reach `docker run`
only through its 0600 `--env-file`, never argv nor the docker client's own environment. So no job
field is ever parsed by a shell, shown by `ps` or read by the root docker client itself.

Steps: run document (IMDSv2 user data, --user-data FILE, or an S3 pointer checked against its SHA-256)
-> instance facts (IMDS) -> this node's GPU check (`gpu_health.py`: a node that fails it reports
"unhealthy-node" and never joins the gang) -> rendezvous (rank 0's private IP is the master) -> the job role, assumed for
this attempt and served on loopback (IMDS blocked for the container) -> image pull -> for a replacement,
wait (bounded) for the interrupted attempt to end -> secrets, read as the job -> this host's primary
interface, checkpoint staging folder and EFA devices (`hardware.py`) -> workload (runtime
`docker` or `process`; SIGTERM/SIGINT are forwarded; its output folder uploaded on request and at
the end, `outputs.py`; a node whose workload stopped at another node's spot warning waits for the
control plane to raise its generation, then rendezvous again with the gang's replacement and runs it
once more: `_regroup`; a workload that failed while new hardware XIDs were logged is reported as a
hardware fault) -> "Job Exited" on the event bus -> `shutdown -h now`. With `keep_on_failure`, a
workload that crashed (not 0, not 75, no signal, no hardware fault) leaves its container's filesystem
running idle under its name and the host up (`Runtime.keep_for_inspection`); the power-off is then
scheduled after the keep.
With a `log_group` in the document, this log and the workload's output also go to CloudWatch Logs,
one stream each per node (`contract.job_log_stream`); lines logged before the rendezvous names the
node are kept and sent then, and a bootstrap that fails before it uses its launch index as the node.
Needs only Python 3.9+ and boto3 (a bare AMI). See docs/instance.md.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from typing import Any

from gpujobs.instance import aws
from gpujobs.instance.cloudwatch_agent import GpuMetrics
from gpujobs.instance.cloudwatch_logs import LogShipper
from gpujobs.instance.contract import (
    BOOTSTRAP_LOG_STREAM_SUFFIX,
    EXIT_BOOTSTRAP_FAILED,
    EXIT_PREEMPTED,
    EXIT_UNHEALTHY_NODE,
    job_log_stream,
)
from gpujobs.instance.credentials import JobCredentials, instance_identity_signer
from gpujobs.instance.errors import StoppedError, UnhealthyNodeError
from gpujobs.instance.gpu_health import kernel_log_xids
from gpujobs.instance.handover import last_commit_by, wait_for_attempt
from gpujobs.instance.hardware import EFA_DEVICE_GLOB, efa_devices, interface_addresses, interface_holding, staging_base
from gpujobs.instance.hostagent import HostAgent
from gpujobs.instance.imds import Imds
from gpujobs.instance.job_secrets import resolve_secrets
from gpujobs.instance.log import SINKS, log
from gpujobs.instance.node_outcome import check_gpus, interconnect_floor, node_outcome
from gpujobs.instance.outputs import Outputs
from gpujobs.instance.rendezvous import Place, rendezvous, wait_for_regroup
from gpujobs.instance.report import exit_detail, publish_exit
from gpujobs.instance.rundoc import load_document
from gpujobs.instance.runtimes import DockerRuntime, ProcessRuntime, Runtime
from gpujobs.instance.signing import signed_exit
from gpujobs.instance.workload_env import container_env

REGROUP_WAIT = 120.0
"""How long a survivor whose workload stopped at another node's warning waits for its generation to be
raised (the control plane tags it as it decides the regroup: seconds, unless its events are late)."""
KEEP_GRACE_MINUTES = 10
"""A host kept for inspection powers itself off this long after its keep would end (a fallback)."""
GPU_METRICS_WAIT = 15.0
"""At the exit, how long an agent setup still running may hold up the report (it then says `pending`)."""


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
    parser.add_argument("--engine", default="", help="process runtime: ENGINE IMAGE COMMAND")
    parser.add_argument("--no-shutdown", action="store_true", help="do not power off at the end")
    parser.add_argument("--rendezvous-timeout", type=float, default=900.0, metavar="SECONDS")
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=240.0,
        metavar="SECONDS",
        help="longest wait for the interrupted attempt (the document's wait_for_attempt) to end",
    )
    parser.add_argument(
        "--regroup-wait",
        type=float,
        default=REGROUP_WAIT,
        metavar="SECONDS",
        help="after the workload stopped at a warning for another node: longest wait for the gang to regroup",
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


def _wait_for_previous_attempt(doc: dict[str, Any], *, ec2: Any, s3: Any, timeout: float) -> None:
    previous = doc["wait_for_attempt"]
    log(f"waiting up to {timeout:.0f}s for attempt {previous} to end")
    ended = wait_for_attempt(
        ec2,
        job_id=doc["job_id"],
        attempt=previous,
        timeout=timeout,
        committed=lambda: last_commit_by(
            s3, uri=doc["checkpoint_uri"], attempt=previous, after_step=doc["resume_from_step"]
        ),
    )
    log(ended)


def _run(
    args: argparse.Namespace, stopper: _Stopper, state: dict[str, Any], bootstrap_log: LogShipper
) -> tuple[int, str]:
    imds = Imds()
    raw = _read_file(args.user_data) if args.user_data else imds.get("/latest/user-data")
    facts = imds.facts()
    state.update(facts)

    def clients(service: str) -> Any:
        return aws.client(service, state["region"])

    doc = load_document(raw, lambda: clients("s3"), state)
    state["doc"] = doc
    state["region"] = doc["region"] or facts["region"]
    log(f"job {doc['job_id']} attempt {doc['attempt']} on {facts['instance_id']}")
    floor = interconnect_floor(doc, facts["instance_type"], gpus_seen=check_gpus(doc, facts["instance_type"]))
    place = _rendezvous(args, clients, doc, facts)
    state["rank"] = place.rank
    if args.master_port is not None:
        doc = {**doc, "master_port": args.master_port}
    runtime = _runtime(args, doc, place, region=state["region"], clients=clients, log_to=bootstrap_log)
    job_clients, agent_env, private = _job_access(doc, clients, imds, runtime, region=state["region"])
    if isinstance(runtime, DockerRuntime) and doc["gpus_per_node"] > 0:  # the idle alarms' metric, during the pull
        state["gpu_metrics"] = GpuMetrics(state["region"]).start()
    runtime.prepare(doc, clients)
    if doc["wait_for_attempt"] is not None:
        _wait_for_previous_attempt(doc, ec2=clients("ec2"), s3=job_clients("s3"), timeout=args.wait_timeout)
    private.update(resolve_secrets(doc["secrets"], job_clients))
    folder, output_dir = runtime.outputs_folder() if doc["outputs_uri"] else ("", "")
    _use_efa(runtime, doc, facts["instance_type"])
    staging = runtime.staging_folder(staging_base(doc, facts["instance_type"]))
    interface = _primary_interface(facts["local_ipv4"])
    xids_before = kernel_log_xids() if doc["gpus_per_node"] > 0 else []
    while True:
        env = container_env(
            doc,
            rank=place.rank,
            master_addr=args.master_addr or place.master,
            instance_id=facts["instance_id"],
            region=state["region"],
            output_dir=output_dir,
            staging_dir=staging,
            socket_interface=interface,
            instance_type=facts["instance_type"],
            interconnect_floor=floor,
        )
        env.update(agent_env)
        code = _train(runtime, doc, env, private, stopper=stopper, place=place, outputs=(folder, job_clients))
        regrouped = _regroup(args, clients, doc, facts, place, code=code, stopper=stopper, imds=imds)
        if regrouped is None or stopper.signum:  # a stop during the wait ends the node's part too
            break
        place = regrouped
        state["rank"] = place.rank
        if doc["log_group"]:  # its output now goes to its new rank's stream of the new generation
            runtime.send_output_to(
                group=doc["log_group"], stream=_stream(doc, place), region=state["region"], clients=clients
            )
    code, message, state["kept_seconds"] = node_outcome(
        code, runtime, signum=stopper.signum, xids_before=xids_before, doc=doc
    )
    return code, message


def _job_access(
    doc: dict[str, Any], clients: aws.Clients, imds: Imds, runtime: Runtime, *, region: str
) -> tuple[aws.Clients, dict[str, str], dict[str, str]]:
    """The job role's clients, and the workload's environment (public, private) to reach its credentials."""
    if not doc["job_role_arn"]:
        log("the document names no job role: the workload runs with this instance's credentials")
        return clients, {}, {}
    job = JobCredentials(clients("lambda"), doc, sign=instance_identity_signer(region))
    agent = HostAgent(job, imds).start()
    agent_env, private = agent.workload_env()
    if isinstance(runtime, DockerRuntime):
        runtime.block_imds()
    log(f"the workload gets the job role's credentials from {agent.endpoint}")
    return job.clients(region), agent_env, private


def _rendezvous(args: argparse.Namespace, clients: aws.Clients, doc: dict[str, Any], facts: dict[str, Any]) -> Place:
    return rendezvous(
        clients("ec2"),
        job_id=doc["job_id"],
        attempt=doc["attempt"],
        nodes=doc["nodes"],
        instance_id=facts["instance_id"],
        own_ip=facts["local_ipv4"],
        timeout=args.rendezvous_timeout,
    )


def _train(
    runtime: Runtime,
    doc: dict[str, Any],
    env: dict[str, str],
    private: dict[str, str],
    *,
    stopper: _Stopper,
    place: Place,
    outputs: tuple[str, aws.Clients],
) -> int:
    """Run the workload once, as node `place.rank` of its gang, and return its exit code."""
    folder, job_clients = outputs
    master = env.get("GPUJOBS_MASTER_ADDR", place.master)
    log(f"starting the workload as node {place.rank} of {doc['nodes']}, master {master}")
    stopper.timeout, stopper.starting = doc["stop_timeout_seconds"], True
    runtime.start(doc, env, private)
    stopper.runtime = runtime
    if stopper.signum:  # arrived while starting
        runtime.stop(stopper.signum, stopper.timeout)
    kept = Outputs(folder, job_clients, uri=doc["outputs_uri"], node_rank=place.rank) if folder else nullcontext()
    with kept:  # requests served while the workload runs, the rest uploaded when it ends
        code = runtime.wait()
    stopper.runtime = None  # until a regroup starts it again, a signal is only remembered (`starting`)
    return code


def _regroup(
    args: argparse.Namespace,
    clients: aws.Clients,
    doc: dict[str, Any],
    facts: dict[str, Any],
    place: Place,
    *,
    code: int,
    stopper: _Stopper,
    imds: Imds,
) -> Place | None:
    """This node's place in its regrouped gang, when the workload stopped at a warning for another
    node (it saved and exited 75 with the gang, nobody signalled this bootstrap and spot did not warn
    this instance) and the control plane raises this node's generation within `--regroup-wait` (a
    signal ends the wait); None: its part is over."""
    if code != EXIT_PREEMPTED or stopper.signum or doc["nodes"] < 2 or doc["checkpoint_mode"] != "gpujobs":
        return None
    if imds.spot_notice():
        log("spot is reclaiming this instance: its part of the attempt is over")
        return None
    log(f"the workload stopped at a warning: waiting up to {args.regroup_wait:.0f}s for the gang to regroup")
    raised = wait_for_regroup(
        clients("ec2"),
        instance_id=facts["instance_id"],
        above=place.generation,
        timeout=args.regroup_wait,
        stopped=lambda: bool(stopper.signum),
    )
    if raised is None:
        log("the gang does not regroup around this node: its part of the attempt is over")
        return None
    log(f"the gang regroups as generation {raised}: a replacement joins it, rendezvous again")
    return _rendezvous(args, clients, doc, facts)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _primary_interface(ip: str) -> str | None:
    name = interface_holding(ip, interface_addresses())
    log(f"NCCL and gloo use {name}, which holds {ip}" if name else f"no interface holds {ip}: NCCL and gloo choose")
    return name


def _use_efa(runtime: Runtime, doc: dict[str, Any], instance_type: str) -> None:
    devices = efa_devices(doc, instance_type)
    if instance_type in doc["efa_instance_types"] and not devices:
        log(f"{instance_type} launched with EFA but no {EFA_DEVICE_GLOB} (no EFA driver?): NCCL falls back to TCP")
    if devices and isinstance(runtime, DockerRuntime):
        runtime.use_efa(devices)
        log(f"the container gets {len(devices)} EFA device(s) and an unlimited memlock")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    stopper = _Stopper()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stopper)
    state: dict[str, Any] = {"region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")}
    bootstrap_log = LogShipper(lambda: aws.client("logs", state["region"]))
    SINKS.append(bootstrap_log.write)
    log(f"Python {platform.python_version()} at {sys.executable}")
    try:
        code, message = _run(args, stopper, state, bootstrap_log)
        reason = "exited"
    except StoppedError as exc:
        code, reason, message = 128 + exc.signum, "bootstrap-failed", str(exc)
    except UnhealthyNodeError as exc:
        code, reason, message = EXIT_UNHEALTHY_NODE, "unhealthy-node", str(exc)
    except Exception as exc:  # every failure must still be reported
        code, reason, message = EXIT_BOOTSTRAP_FAILED, "bootstrap-failed", f"{type(exc).__name__}: {exc}"
    stopper.starting = True  # from here on a signal is only remembered: the exit must still be reported
    log(f"{reason}: {message}")
    doc: dict[str, Any] = state.get("doc") or state.get("raw") or {}
    bus = doc.get("event_bus") or args.event_bus
    metrics = state.get("gpu_metrics")
    detail = exit_detail(
        doc,
        node_rank=state.get("rank"),
        instance_id=state.get("instance_id"),
        exit_code=code,
        reason=reason,
        message=message,
        gpu_metrics=metrics.result(timeout=GPU_METRICS_WAIT) if metrics else None,
    )
    if bus and state.get("region"):
        detail = signed_exit(detail, doc.get("report_key"), now=time.time())
        publish_exit(lambda: aws.client("events", state["region"]), bus=str(bus), detail=detail)
    else:
        log("no event bus or region known: the exit is not published")
    _close_bootstrap_log(bootstrap_log, state)
    if not args.no_shutdown:
        subprocess.run(["shutdown", "-h", _power_off_at(state.get("kept_seconds", 0))], check=False)
    return code


def _power_off_at(kept_seconds: int) -> str:
    """`now`, or for a host kept for inspection, its own deadline: the control plane terminates it
    when the keep is over (or at a cancel); this is the fallback, `KEEP_GRACE_MINUTES` later."""
    if not kept_seconds:
        return "now"
    return f"+{math.ceil(kept_seconds / 60) + KEEP_GRACE_MINUTES}"


def _runtime(
    args: argparse.Namespace,
    doc: dict[str, Any],
    place: Place,
    *,
    region: str,
    clients: aws.Clients,
    log_to: LogShipper,
) -> Runtime:
    """The runtime `args` name; with a log group, this node's output and this log are sent there."""
    runtime: Runtime = (
        ProcessRuntime(shlex.split(args.entrypoint), shlex.split(args.engine))
        if args.runtime == "process"
        else DockerRuntime()
    )
    if doc["log_group"]:
        stream = _stream(doc, place)
        log_to.open(doc["log_group"], stream + BOOTSTRAP_LOG_STREAM_SUFFIX)
        runtime.send_output_to(group=doc["log_group"], stream=stream, region=region, clients=clients)
        log(f"the workload's output goes to CloudWatch Logs {doc['log_group']} {stream}")
    return runtime


def _stream(doc: dict[str, Any], place: Place) -> str:
    team = doc["team"] or None
    return job_log_stream(doc["job_id"], doc["attempt"], place.rank, team=team, generation=place.generation)


def _close_bootstrap_log(bootstrap_log: LogShipper, state: dict[str, Any]) -> None:
    """Send the rest of this log; a bootstrap that failed before its rendezvous sends it all now."""
    SINKS.remove(bootstrap_log.write)
    doc = state.get("doc")
    if not bootstrap_log.stream and doc and doc["log_group"] and state.get("region"):
        node = state.get("rank", state.get("launch_index", 0))
        bootstrap_log.open(
            doc["log_group"],
            job_log_stream(doc["job_id"], doc["attempt"], node, team=doc["team"] or None) + BOOTSTRAP_LOG_STREAM_SUFFIX,
        )
    bootstrap_log.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
