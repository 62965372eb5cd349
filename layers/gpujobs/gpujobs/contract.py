"""The names every part of gpujobs agrees on, written once.

Tags on AWS resources, the names of the resources the control plane creates, the sets of EC2
instance states it reasons about, the sources and detail-types of the events it publishes and
consumes, and the exit codes of the instance and the trainer. Each is a promise between two
components that ship separately: the Lambda functions, the instance bootstrap (stdlib only, shipped
in user data), the training image, template.yaml (event patterns, IAM resource names) and the local
cloud's EC2.

Pieces that cannot import this module keep a copy: `gpujobs/instance/contract.py` (the bootstrap
must run on a bare Python with the standard library alone), `gpujobs_trainer.errors` and
`gpujobs_trainer.events` (another artifact), template.yaml and the local cloud. One test
(`tests/unit/test_contract.py`) compares every copy with this module and searches the sources for
a stray literal, so no copy can drift. Stdlib only, imported by every layer, importing nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum

# ---- tags ----------------------------------------------------------------------------------
STACK_TAG = "gpujobs:stack"
"""On everything the stack creates; the IAM policies condition every mutating call on it."""
JOB_TAG = "gpujobs:job-id"
ATTEMPT_TAG = "gpujobs:attempt"
"""The attempt number, as decimal text."""
GENERATION_TAG = "gpujobs:generation"
"""The gang's generation within its attempt, as decimal text (absent: 0): a regroup (`domain.regroup`)
launches the replacement with the next one and raises the survivors' to it; the nodes rendezvous
with the nodes of their own generation."""
TEAM_TAG = "gpujobs:team"
"""On instances, and a session tag of the job role (its policy reads `aws:PrincipalTag/gpujobs:team`)."""
SECRET_NAME_PREFIX = "gpujobs/"  # noqa: S105 (a name prefix, not a secret)
"""Secrets a team's jobs may read: Secrets Manager `gpujobs/<team>/...`, SSM `/gpujobs/<team>/...` (docs/deploy.md)."""
NAME_TAG = "Name"

# ---- names of what the control plane creates -------------------------------------------------
RESOURCE_PREFIX = "gpujobs-"
IDLE_ALARM_PREFIX = "gpujobs-idle-"


def container_name(job_id: str, attempt: int) -> str:
    """The training container on each instance of an attempt (SSM's checkpoint-now addresses it)."""
    return f"gpujobs-{job_id}-a{attempt}"


def placement_group_name(job_id: str, attempt: int) -> str:
    """The cluster placement group of a multi-node attempt (IAM allows `placement-group/gpujobs-*`)."""
    return f"gpujobs-{job_id}-a{attempt}"


def job_security_group_name(stack: str, job_id: str) -> str:
    """A job's own security group: its instances reach each other, and no other job's instances."""
    return f"gpujobs-{stack}-{job_id}"


def instance_display_name(job_name: str, attempt: int) -> str:
    """The `Name` tag people see in the EC2 console."""
    return f"gpujobs-{job_name}-a{attempt}"


def idle_alarm_name(stack: str, instance_id: str) -> str:
    """One GPU-idle alarm per instance; the idle rule matches the prefix `gpujobs-idle-<stack>-i-`."""
    return f"{IDLE_ALARM_PREFIX}{stack}-{instance_id}"


ALL_TEAMS_SCOPE = "all"
"""The budget scope that covers every team of the stack."""


def budget_name(stack: str, scope: str) -> str:
    """`gpujobs-<stack>-all` or `gpujobs-<stack>-team-<team>`: how a budget names the scope it governs."""
    return f"gpujobs-{stack}-{scope}" if scope == ALL_TEAMS_SCOPE else f"gpujobs-{stack}-team-{scope}"


# ---- job sessions (the credentials function) -------------------------------------------------
JOB_SESSION_HEADER = "X-Gpujobs-Job-Session"
"""A header the instance signs into its `sts:GetCallerIdentity` proof, naming `<stack>/<job>/<attempt>`:
a proof made for one job session is good for nothing else (`gpujobs.domain.job_sessions`)."""


def job_session_purpose(stack: str, job_id: str, attempt: int) -> str:
    """The value of `JOB_SESSION_HEADER` for one attempt's session."""
    return f"{stack}/{job_id}/{attempt}"


# ---- EC2 instance states ---------------------------------------------------------------------
INSTANCE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down", "terminated")
"""Every state of EC2's instance lifecycle."""
LIVE_STATES = ("pending", "running", "stopping", "stopped")
"""The instance still exists (it may be restarted, or still cost money): what lookups by tag return."""
GONE_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
"""The instance no longer runs its workload, or is about to stop running it: its attempt can be judged."""
WORKLOAD_MAY_RUN_STATES = ("pending", "running", "stopping", "shutting-down")
"""Processes may still run on it (a reclaimed instance saves its checkpoint while shutting down)."""
STOPPED_STATES = ("stopping", "stopped")
"""Stopped, not terminated: its volumes stay and it can be started again."""
UP_STATES = ("pending", "running")
"""Up or coming up: what a gang's rendezvous counts, and what an ended attempt must not have."""

# ---- the workload's environment and checkpoints ----------------------------------------------
WORKLOAD_ENV: tuple[str, ...] = (
    "GPUJOBS_JOB_ID",
    "GPUJOBS_ATTEMPT",
    "GPUJOBS_NNODES",
    "GPUJOBS_NODE_RANK",
    "GPUJOBS_NPROC_PER_NODE",
    "GPUJOBS_MASTER_ADDR",
    "GPUJOBS_MASTER_PORT",
    "GPUJOBS_CHECKPOINT_URI",
    "GPUJOBS_CHECKPOINT_EVERY_MINUTES",
    "GPUJOBS_EVENT_BUS",
    "GPUJOBS_INSTANCE_ID",
    "GPUJOBS_RESUME_FROM_STEP",
    "GPUJOBS_REPORT_KEY",
    "GPUJOBS_CHECKPOINT_KEY",
    "GPUJOBS_OUTPUT_DIR",
    "GPUJOBS_CHECKPOINT_MODE",
    "GPUJOBS_CODE_URI",
    "GPUJOBS_CODE_SHA256",
    "GPUJOBS_SETUP",
    "GPUJOBS_REQUIREMENTS",
    "GPUJOBS_VENV_CACHE_URI",
    "GPUJOBS_INSTANCE_TYPE",
    "GPUJOBS_INTERCONNECT_FLOOR_GBS",
)
"""What the bootstrap tells the training container (the trainer reads these; a spec may not set them)."""
TRAINER_SETTING_VARIABLES = {
    "collective_timeout_seconds": "GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS",
    "checkpoint_every_steps": "GPUJOBS_CHECKPOINT_EVERY_STEPS",
    "keep_checkpoints": "GPUJOBS_KEEP_CHECKPOINTS",
    "async_checkpoints": "GPUJOBS_ASYNC_CHECKPOINTS",
    "compile": "GPUJOBS_COMPILE",
    "heartbeat_seconds": "GPUJOBS_HEARTBEAT_SECONDS",
    "log_level": "GPUJOBS_LOG_LEVEL",
}
"""Setting of the spec's `trainer:` section -> the variable that carries it to the trainer (which
reads it in `gpujobs_trainer.config`). The bootstrap passes them on with the rest of WORKLOAD_ENV."""
WORKLOAD_ENV += tuple(TRAINER_SETTING_VARIABLES.values())
CHECKPOINT_COMMIT_FILE = "COMMIT.json"
"""Written last into a checkpoint's folder: a folder without it is a save that was cut short."""
LAST_COMMIT_REASONS = ("preempted", "final")
"""Commit reasons an attempt writes only as it ends (a `periodic` or `on-demand` one may be followed by more)."""


def checkpoint_step_dir(step: int) -> str:
    """`step-NNNNNNNN`: the folder of the checkpoint taken at `step` (eight digits sort like numbers)."""
    return f"step-{step:08d}"


# ---- job logs (CloudWatch Logs) ---------------------------------------------------------------
JOB_LOG_GROUP_SUFFIX = "/jobs"
"""The stack's job log group is `/gpujobs/<stack>/jobs` (template.yaml `JobLogGroup`)."""
BOOTSTRAP_LOG_STREAM_SUFFIX = "/bootstrap"
"""A node's bootstrap log is its workload stream's name plus this suffix."""
BOOTSTRAP_OBJECT_PREFIX = "bootstrap/"
"""Where in the stack's bucket the launcher stores the bootstrap (one object per content SHA-256)."""


def job_log_group(stack: str) -> str:
    """The log group every job's output goes to; IAM scopes the instance role's writes to it."""
    return f"/gpujobs/{stack}{JOB_LOG_GROUP_SUFFIX}"


def job_log_stream(job_id: str, attempt: int, node: int, *, team: str | None, generation: int = 0) -> str:
    """`<team>/<job>/<attempt>/<node>`: one node's workload output (the container's stdout and stderr).

    The team comes first so that IAM can give a team's users its streams and no other's
    (`log-stream:<team>/*`, docs/security.md). `team=None` names a stream of an attempt launched by
    a release before teams were in the names, `<job>/<attempt>/<node>`: those are only read. After a
    regroup (`domain.regroup`) node `<node>` of the gang's generation `<g>` writes `.../<node>/g<g>`."""
    stream = f"{job_id}/{attempt}/{node}" if team is None else f"{team}/{job_id}/{attempt}/{node}"
    return f"{stream}/g{generation}" if generation else stream


def bootstrap_log_stream(job_id: str, attempt: int, node: int, *, team: str | None) -> str:
    """`<team>/<job>/<attempt>/<node>/bootstrap`: that node's bootstrap log (pull, rendezvous, exit)."""
    return job_log_stream(job_id, attempt, node, team=team) + BOOTSTRAP_LOG_STREAM_SUFFIX


# ---- the job's outputs (artifacts) -------------------------------------------------------------
OUTPUT_DIR_ENV = "GPUJOBS_OUTPUT_DIR"
"""The workload's folder for what outlives the job: the bootstrap uploads it to `outputs_prefix`."""
OUTPUT_UNSENT_PREFIX = ".gpujobs-"
"""Files in that folder whose names start with it are never uploaded: requests, and files being
written (the trainer writes `.gpujobs-<name>`, then renames it to `<name>`)."""
OUTPUT_UPLOAD_REQUEST_FILE = OUTPUT_UNSENT_PREFIX + "upload-now"
"""Created in that folder to ask for an upload before the job ends."""
OUTPUT_UPLOAD_TAKEN_FILE = OUTPUT_UNSENT_PREFIX + "uploading"
"""The request, renamed by the bootstrap as it starts that upload and removed once it is done: a
workload that waits for both names to be gone knows what it wrote before asking is in S3."""
OUTPUTS_PREFIX = "outputs/"
"""Where outputs go in the stack's bucket: outside `jobs/`, so the checkpoints' expiry rule never reaches them."""


def outputs_prefix(job_id: str, *, team: str | None) -> str:
    """`outputs/<team>/<job-id>/`: node 0's files at its root, node K's (K > 0) under `node-K/` (docs/cli.md).

    The team comes first so that IAM can give a team's users its outputs and no other's
    (`outputs/<team>/*`, docs/security.md). `team=None` names the outputs of a job whose attempts
    a release before teams were in the names launched, `outputs/<job-id>/`: those are only read."""
    return f"{OUTPUTS_PREFIX}{job_id}/" if team is None else f"{OUTPUTS_PREFIX}{team}/{job_id}/"


TENSORBOARD_OUTPUTS = "tensorboard/"
"""Where node 0's TensorBoard event files land under a job's outputs prefix: the trainer's launcher
gives the workload `$GPUJOBS_TB_DIR` = this folder of its output folder; `gpujobs tensorboard` reads it."""


# ---- events ----------------------------------------------------------------------------------
CONTROL_PLANE_SOURCE = "gpujobs"
"""What the control plane publishes on the stack's bus."""
JOB_STATE_CHANGE = "GPU Job State Change"
BUDGET_WARNING = "GPU Budget Warning"
BUDGET_HOLD = "GPU Budget Hold"
IDLE_DETECTION_OFF = "GPU Idle Detection Off"
"""A running job's idle alarms get no GPU metric (`domain.idle_detection`): an idle GPU would not be stopped."""

TRAINER_SOURCE = "gpujobs.trainer"
"""What the training container reports."""
CHECKPOINT_COMMITTED = "Checkpoint Committed"
TRAINING_HEARTBEAT = "Training Heartbeat"

INSTANCE_SOURCE = "gpujobs.instance"
"""What the instance bootstrap reports."""
JOB_EXITED = "Job Exited"

REPORT_DETAIL_TYPES = (CHECKPOINT_COMMITTED, TRAINING_HEARTBEAT, JOB_EXITED)
"""What the reports function handles (from either source)."""

# ---- authenticated reports (gpujobs.domain.report_auth explains the scheme) --------------------
REPORT_SIGNATURE_SCHEME = "gpujobs-report-v1"
"""The first element of every canonical form: a new scheme never verifies under an old one."""
REPORT_SIGNED_FIELDS = {
    CHECKPOINT_COMMITTED: ("job_id", "attempt", "step", "uri"),
    TRAINING_HEARTBEAT: ("job_id", "attempt", "step"),
    JOB_EXITED: ("job_id", "attempt", "exit_code", "instance_id", "node_rank"),
}
"""Per detail-type, the fields the control plane acts on: each is covered by the signature."""
REPORT_SIGNED_EXTENSIONS: dict[str, tuple[str, ...]] = {
    TRAINING_HEARTBEAT: ("metrics", "steps_per_second", "samples_per_second")
}
"""Fields signed too when the report carries the first of them: a heartbeat from a trainer that
reports metrics (every trainer since metrics exist sends ``metrics``, empty or not) signs its metrics
and throughput; an older trainer's heartbeat proves its step alone, and its throughput is not recorded."""


def report_signed_field_names(detail_type: str, detail: Mapping[str, object]) -> tuple[str, ...]:
    """The fields of ``detail`` that its signature covers (`REPORT_SIGNED_EXTENSIONS`)."""
    extension = REPORT_SIGNED_EXTENSIONS.get(detail_type, ())
    carried = bool(extension) and detail.get(extension[0]) is not None
    return REPORT_SIGNED_FIELDS[detail_type] + (extension if carried else ())


MAX_HEARTBEAT_METRICS = 8
"""The most metrics one heartbeat carries (the trainer keeps the first names it was given)."""
METRIC_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_./-]{0,31}$"
"""A metric's name: short, so a week of a job's metrics stays a small part of its record."""
REPORT_PROOF_FIELDS = ("signed_at", "signature")
"""What a signed report adds to its detail: Unix seconds when signed, and the HMAC-SHA256 in hex."""

EC2_SOURCE = "aws.ec2"
SPOT_INTERRUPTION_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
INSTANCE_STATE_CHANGE = "EC2 Instance State-change Notification"
CLOUDWATCH_SOURCE = "aws.cloudwatch"
ALARM_STATE_CHANGE = "CloudWatch Alarm State Change"
COST_EXPLORER_SOURCE = "aws.ce"
ANOMALY_DETECTED = "Anomaly Detected"


# ---- exit codes ------------------------------------------------------------------------------
class ExitCode(IntEnum):
    """What an instance's workload exit code means to the control plane."""

    SUCCEEDED = 0
    """Training finished; the final checkpoint is committed."""
    CRASHED = 1
    """Anything not listed here counts as a crash."""
    SYNC_FAILED = 74
    """EX_IOERR: a `directory` script ended well (exited 0, or was stopped) but the launcher's last
    sync of its checkpoint folder failed: S3 holds the sync before. Retried for the sync (counted
    toward max_attempts), never judged the script's crash."""
    PREEMPTED = 75
    """EX_TEMPFAIL: interrupted, a checkpoint is committed; resume me."""
    CONFIG_ERROR = 78
    """EX_CONFIG: the job is misconfigured; retrying the same configuration fails the same way."""
    HARDWARE_FAULT = 121
    """The bootstrap's: the workload failed and the node's kernel log shows new hardware XID errors
    since it started (`gpujobs.instance.gpu_health`): the machine's fault, not the job's."""
    UNHEALTHY_NODE = 122
    """The bootstrap's: the node's GPU check failed before the workload started (too few GPUs, an
    uncorrected ECC error or a retirement pending, a failed `dcgmi diag`, a hardware XID)."""
    SLOW_INTERCONNECT = 123
    """The launcher's, inside the job's container: the gang's all-reduce bus bandwidth, measured
    before `requirements:`/`setup:` and the workload, is below the type's floor. The job's container's
    claim, not the host's (its image is the user's): believed only from an attempt that has made no
    progress (`fate.slow_interconnect`), and never held against a spot pool."""
    BOOTSTRAP_FAILED = 125
    """The instance bootstrap could not start the workload (as `docker run` exits 125 when it cannot
    run a container). Not 127: that is a shell's "command not found", a configuration error."""
