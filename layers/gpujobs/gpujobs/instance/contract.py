"""The bootstrap's copy of the names it shares with the control plane and the trainer.

The bootstrap is bundled into EC2 user data and runs on a bare Python 3.9 with the stdlib and boto3,
so it cannot import the layer-wide contract. It keeps its own copy of each shared name here, in one
place, and a test compares every copy with the layer's, so the two cannot drift.
"""

from __future__ import annotations

import re

TAG_JOB_ID = "gpujobs:job-id"
"""Instance tag the launcher sets: the job an instance runs."""
TAG_ATTEMPT = "gpujobs:attempt"
"""Instance tag the launcher sets: the attempt number, in decimal."""
TAG_GENERATION = "gpujobs:generation"
"""Instance tag: the gang's generation within the attempt, in decimal (absent: 0). The control plane
raises a survivor's when a reclaimed node's replacement joins the gang (rendezvous.py)."""
WORKLOAD_UID = 10001
"""The uid the container runs as (the training image's USER; `docker run --user`), owner of its mounted folders."""

EVENT_SOURCE = "gpujobs.instance"
"""Source of the exit event the bootstrap publishes."""
EVENT_DETAIL_TYPE = "Job Exited"
"""Detail-type of that exit event (the trainer publishes the same one from its own source)."""
EXIT_SIGNED_FIELDS = ("job_id", "attempt", "exit_code", "instance_id", "node_rank")
"""The exit report's fields the control plane acts on: its signature covers them (signing.py)."""
REPORT_SIGNATURE_SCHEME = "gpujobs-report-v1"
"""The first element of the canonical form a report's signature covers."""
REPORT_KEY_ENV = "GPUJOBS_REPORT_KEY"
"""The workload's variable holding its attempt's report key, so the trainer signs its reports too."""
CHECKPOINT_KEY_ENV = "GPUJOBS_CHECKPOINT_KEY"
"""The workload's variable holding its job's checkpoint key: the trainer signs and verifies checkpoints."""
OUTPUT_DIR_ENV = "GPUJOBS_OUTPUT_DIR"
"""The workload's variable naming its output folder, which the bootstrap uploads (outputs.py)."""
INTERCONNECT_FLOOR_ENV = "GPUJOBS_INTERCONNECT_FLOOR_GBS"
"""A multi-node gang's all-reduce floor in GB/s, which the launcher measures the gang against before
the job's code runs ("0": measure and log only); absent for a single node (`node_outcome.interconnect_floor`)."""
OUTPUT_UNSENT_PREFIX = ".gpujobs-"
"""Names in that folder that are never uploaded: the request below, and files still being written."""
OUTPUT_UPLOAD_REQUEST_FILE = OUTPUT_UNSENT_PREFIX + "upload-now"
"""A file the workload creates in that folder to ask for an upload now."""
OUTPUT_UPLOAD_TAKEN_FILE = OUTPUT_UNSENT_PREFIX + "uploading"
"""The request, renamed while its upload runs and removed once the upload is done."""
JOB_SESSION_HEADER = "X-Gpujobs-Job-Session"
"""The header the instance signs into its identity proof for the credentials function (credentials.py)."""


def job_session_purpose(stack: str, job_id: str, attempt: int) -> str:
    """That header's value: the one job session the proof is good for."""
    return f"{stack}/{job_id}/{attempt}"


EXIT_BOOTSTRAP_FAILED = 125
"""Exit code reported with reason "bootstrap-failed" when the workload could not be started."""
EXIT_HARDWARE_FAULT = 121
"""The workload failed and new hardware XID errors were logged while it ran (gpu_health.py)."""
EXIT_UNHEALTHY_NODE = 122
"""The node's GPU check failed before the workload started (gpu_health.py): replace this node."""
EXIT_SLOW_INTERCONNECT = 123
"""The launcher's (the job's container): the gang's all-reduce bandwidth is below the type's floor
(`GPUJOBS_INTERCONNECT_FLOOR_GBS`); passed through unchanged, the control plane relaunches the gang."""
EXIT_PREEMPTED = 75
"""The trainer's exit after a preemption's checkpoint committed (EX_TEMPFAIL): a survivor of another
node's warning may regroup (bootstrap.py)."""

RENDEZVOUS_STATES = ("pending", "running")
"""States of an instance that can still join its attempt's rendezvous."""
ALIVE_STATES = ("pending", "running", "stopping", "shutting-down")
"""States of an instance that may still run its workload: anything short of stopped or terminated."""


def container_name(job_id: str, attempt: int) -> str:
    """`gpujobs-<job>-a<attempt>`; characters docker does not allow in a name become `-`."""
    return "gpujobs-" + re.sub(r"[^a-zA-Z0-9_.-]", "-", job_id) + f"-a{attempt}"


CHECKPOINT_STEP_DIR = re.compile(r"^step-(\d{8})/?$")
"""A checkpoint folder the trainer writes under the job's checkpoint URI: `step-NNNNNNNN/`."""
CHECKPOINT_COMMIT_FILE = "COMMIT.json"
"""The trainer's commit marker in a step folder: written last, it records `attempt` and `reason`."""
LAST_COMMIT_REASONS = ("preempted", "final")
"""Commit reasons an attempt writes only as it ends (a `periodic` commit may be followed by more)."""


def checkpoint_step_dir(step: int) -> str:
    """The folder name of the checkpoint taken at `step`."""
    return f"step-{step:08d}"


BOOTSTRAP_LOG_STREAM_SUFFIX = "/bootstrap"
"""A node's bootstrap log stream is its workload stream's name plus this suffix."""


def job_log_stream(job_id: str, attempt: int, node: int, *, team: str | None, generation: int = 0) -> str:
    """`<team>/<job>/<attempt>/<node>`: one node's workload output in the job log group; without a
    team (a run document of a release before teams were in the names) `<job>/<attempt>/<node>`.
    A regrouped gang's (generation above 0) are `.../<node>/g<generation>`."""
    stream = f"{job_id}/{attempt}/{node}" if team is None else f"{team}/{job_id}/{attempt}/{node}"
    return f"{stream}/g{generation}" if generation else stream
