"""The run document: everything an instance needs to run one attempt of a job.

It travels as JSON inside the instance's user data (or, when too large, in S3 with a pointer in
user data) and is read by the fixed bootstrap program (`gpujobs.instance`, whose stdlib mirror of
this model is `gpujobs/instance/rundoc.py`). Command and env stay structured data end to end: no
field is ever spliced into a shell command.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpujobs.domain.attempts import ended_in_a_row
from gpujobs.domain.hardware import (
    INTERCONNECT_RELAUNCHES,
    InstanceHardware,
    efa_instance_types,
    gpu_counts,
    instance_store_types,
    interconnect_floors,
)
from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.job_access import job_prefix, outputs_uri
from gpujobs.domain.spec_parts import setup_argv
from gpujobs.domain.states import Reason

RUN_DOCUMENT_VERSION = 1


class RunDocument(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = RUN_DOCUMENT_VERSION
    job_id: str
    attempt: int
    name: str
    image: str
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    nodes: int = 1
    gpus_per_node: int = 1
    checkpoint_uri: str
    """s3://bucket/jobs/<job_id>/ckpt: the trainer saves and resumes here."""
    resume_from_step: int | None = None
    """Newest committed step the control plane knows of; the trainer still takes the newest committed."""
    checkpoint_every_minutes: int = 30
    event_bus: str = ""
    region: str = ""
    master_port: int = 29500
    stop_timeout_seconds: int = 120
    wait_for_attempt: int | None = None
    """The attempt whose instances must be gone before this one starts the container.

    Set on a replacement launched while the interrupted attempt may still be saving its checkpoint:
    the bootstrap waits (bounded) until that attempt's instances are gone or its last checkpoint is
    committed, so the trainer resumes from that checkpoint rather than an older one.
    """
    report_key: str = Field(default="", repr=False)
    """This attempt's report key, in hex (`domain.report_auth`): the instance signs its reports with it.
    Kept out of reprs; when the document is offloaded, the S3 copy holds "" and the pointer the key."""
    checkpoint_key: str = Field(default="", repr=False)
    """The job's checkpoint key, in hex (`domain.report_auth.checkpoint_key`): the trainer signs and
    verifies the job's checkpoints with it. Travels like `report_key` (never in the S3 copy)."""
    job_role_arn: str = ""
    """The stack's job role: the container runs with a session of it, which the bootstrap serves."""
    credentials_function: str = ""
    """The function that vends that session (`domain.job_sessions`): the bootstrap asks it, proving
    with its instance role that it is one of this attempt's instances. Only that function may
    assume the job role."""
    stack: str = ""
    """The stack's name: the identity proof names it, with the job and attempt, in a signed header."""
    session_policy: str = ""
    """The inline session policy of that role for this attempt (`gpujobs.domain.job_access`), as JSON:
    rendered at launch, so that one over STS's limit is refused before any instance starts. The
    credentials function renders its own from the job's record; this copy is what the launch saw."""
    session_tags: dict[str, str] = Field(default_factory=dict)
    """Session tags (job id, team, attempt) the role's own policy is written against (as above: a record)."""
    secrets: dict[str, str] = Field(default_factory=dict)
    """Env name -> secret reference (never a value); the bootstrap resolves them at start."""
    team: str = ""
    """The job's team: the first part of its log stream names (`contract.job_log_stream`), so IAM can
    scope a team's users to them. "" only in a document of a release before teams were in the names."""
    log_group: str = ""
    """The stack's job log group: each node's output and bootstrap log go there (`contract.job_log_stream`);
    "" keeps them on the instance."""
    outputs_uri: str = ""
    """s3://bucket/outputs/<team>/<job_id>/: where the bootstrap uploads the workload's output folder
    (`gpujobs.instance.outputs`); "" gives the workload no output folder."""
    checkpoint_mode: str = "gpujobs"
    """The spec's `checkpoint` (gpujobs, directory or none): the launcher syncs, restores or neither."""
    code_uri: str = ""
    """The spec's `code` archive (s3://...), unpacked by the launcher into the working directory."""
    code_sha256: str = ""
    """Its hex SHA-256 when known: the launcher refuses an archive with any other digest."""
    setup: list[list[str]] = Field(default_factory=list)
    """The spec's `setup:` as argv lists (a string already `/bin/sh -c STRING`): the launcher runs
    them in the container, in order, before the command."""
    requirements: str = ""
    """The spec's `requirements:`, a path inside the unpacked code: installed into a layered venv."""
    venv_cache_uri: str = ""
    """s3://bucket/jobs/<job_id>/venvs: where that venv is cached by content (only with `requirements`)."""
    trainer_env: dict[str, str] = Field(default_factory=dict)
    """The spec's `trainer:` settings that differ from the trainer's defaults, as the `GPUJOBS_*`
    variables the trainer reads (`gpujobs.domain.trainer_settings.TrainerSettings.environment`)."""
    efa_instance_types: list[str] = Field(default_factory=list)
    """The spec's types this attempt launches with EFA interfaces (`domain.hardware`): on those the
    container gets the host's `/dev/infiniband/uverbs*` devices and an unlimited memlock."""
    instance_store_types: list[str] = Field(default_factory=list)
    """The spec's types with an NVMe instance store: there checkpoints stage on it (`gpujobs.instance.hardware.INSTANCE_STORE_MOUNT`)."""
    keep_on_failure_seconds: int = 0
    """The spec's `keep_on_failure`: after a failing exit (not 0, not 75) the bootstrap keeps the host up
    and the crashed container's filesystem, idle under its name, for `gpujobs shell` (`domain.keep`),
    powering off by itself this long (and a grace) later; 0: it powers off at once, as after any exit."""
    gpu_counts: dict[str, int] = Field(default_factory=dict)
    """The GPUs of each of the spec's types, from the packaged catalog: a node's GPU check expects
    nvidia-smi to see them all (`gpujobs.instance.gpu_health`); a type left out is checked for `gpus_per_node`."""
    interconnect_floors: dict[str, float] = Field(default_factory=dict)
    """A multi-node gang's all-reduce floor in GB/s per type it launches with EFA (`domain.hardware`):
    the container's launcher measures the gang's bus bandwidth before the job's code runs and exits
    `ExitCode.SLOW_INTERCONNECT` below it. A type left out (or a single node) measures and logs only."""


class RunDocumentPointer(BaseModel):
    """What user data holds instead of the document when the document is too large for it.

    The digest travels in user data, which only the launcher writes, so a document swapped in S3
    after launch is refused by the bootstrap rather than run.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_document_uri: str
    run_document_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex SHA-256 of the exact bytes stored at `run_document_uri`."""
    report_key: str = Field(default="", repr=False)
    """The attempt's report key: in user data only, never in the S3 object."""
    checkpoint_key: str = Field(default="", repr=False)
    """The job's checkpoint key: in user data only, never in the S3 object."""
    job_id: str = ""
    attempt: int | None = None
    event_bus: str = ""
    """Whom the bootstrap reports to when it refuses the document (a swapped or unreadable one):
    without them, a refused document would leave the attempt to be judged only once its instance
    is gone."""

    @classmethod
    def for_stored(
        cls, uri: str, body: bytes, *, report_key: str = "", doc: RunDocument | None = None
    ) -> RunDocumentPointer:
        """The pointer to `body`, stored at `uri`; the keys and, from `doc`, whom to report to
        travel beside it in user data."""
        return cls(
            run_document_uri=uri,
            run_document_sha256=hashlib.sha256(body).hexdigest(),
            report_key=report_key,
            checkpoint_key=doc.checkpoint_key if doc else "",
            job_id=doc.job_id if doc else "",
            attempt=doc.attempt if doc else None,
            event_bus=doc.event_bus if doc else "",
        )


def run_document(
    job: Job,
    attempt: Attempt,
    *,
    bucket: str,
    event_bus: str,
    region: str,
    log_group: str,
    wait_for_attempt: int | None,
    report_key: str,
    access: dict[str, Any],
    hardware: Mapping[str, InstanceHardware] | None = None,
    checkpoint_key: str = "",
) -> RunDocument:
    """Pure: the run document of `attempt` from the job's spec and the stack's settings.

    `access` is the job role, session policy and tags (`job_access`), empty when the stack has no job role;
    `hardware` the facts of the types the spec names (the document is rendered before the ladder picks one).
    """
    spec = job.require_spec()
    return RunDocument(
        job_id=job.job_id,
        attempt=attempt.number,
        name=spec.name,
        image=spec.image,
        command=list(spec.command),
        env=dict(spec.env),
        nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        checkpoint_uri=f"s3://{bucket}/jobs/{job.job_id}/ckpt",
        resume_from_step=job.checkpoint_step,
        checkpoint_every_minutes=spec.checkpoint_every_minutes,
        event_bus=event_bus,
        region=region,
        wait_for_attempt=wait_for_attempt,
        report_key=report_key,
        checkpoint_key=checkpoint_key,
        secrets=dict(spec.secrets),
        team=job.team,
        log_group=log_group,
        outputs_uri=outputs_uri(bucket=bucket, job_id=job.job_id, team=job.team),
        checkpoint_mode=spec.checkpoint.value,
        code_uri=spec.code or "",
        code_sha256=spec.code_sha256 or "",
        setup=[setup_argv(command) for command in spec.setup],
        requirements=spec.requirements or "",
        venv_cache_uri=f"s3://{bucket}/{job_prefix(job.job_id)}venvs" if spec.requirements else "",
        trainer_env=spec.trainer.environment(),
        efa_instance_types=efa_instance_types(hardware or {}, instance_types=spec.instance_types, nodes=spec.nodes),
        instance_store_types=instance_store_types(hardware or {}, instance_types=spec.instance_types),
        keep_on_failure_seconds=int(keep.total_seconds()) if (keep := spec.keeps_on_failure) else 0,
        gpu_counts=gpu_counts(hardware or {}, instance_types=spec.instance_types),
        interconnect_floors={}
        if slow_gangs_in_a_row(job, before=attempt.number) >= INTERCONNECT_RELAUNCHES
        else interconnect_floors(hardware or {}, instance_types=spec.instance_types, nodes=spec.nodes),
        **access,
    )


def slow_gangs_in_a_row(job: Job, *, before: int) -> int:
    """The job's attempts numbered below `before`, newest first, that ended because their gang's
    all-reduce was below the floor, until one that did not: counted as `fate.unhealthy_in_a_row`
    counts (attempts that launched nothing do not break the row), so the gang told to measure only
    comes before the limit that fails the job."""
    count, _ = ended_in_a_row((a for a in job.attempts if a.number < before), (Reason.SLOW_INTERCONNECT.value,))
    return count
