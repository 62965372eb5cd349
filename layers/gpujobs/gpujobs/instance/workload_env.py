"""The workload's environment: what the container (or local process) is told about its job.

The spec's `env`, then the spec's trainer settings and the other GPUJOBS_* variables the trainer
reads (docs/instance.md lists them), which win on a name clash. The runtimes add nothing of the job's: this is the one place that
decides what the workload sees.
"""

from __future__ import annotations

import json
from typing import Any

from gpujobs.instance.contract import CHECKPOINT_KEY_ENV, INTERCONNECT_FLOOR_ENV, OUTPUT_DIR_ENV, REPORT_KEY_ENV
from gpujobs.instance.hardware import SOCKET_INTERFACE_ENVS


def container_env(
    doc: dict[str, Any],
    *,
    rank: int,
    master_addr: str,
    instance_id: str,
    region: str,
    output_dir: str = "",
    staging_dir: str = "",
    socket_interface: str | None = None,
    instance_type: str = "",
    interconnect_floor: float | None = None,
) -> dict[str, str]:
    """The spec's env plus the GPUJOBS_* contract (which wins on a name clash).

    `output_dir` is the output folder as the workload sees it (the runtime's `outputs_folder`),
    `staging_dir` the checkpoint staging folder (`staging_folder`); `socket_interface` the host's
    primary interface, named to NCCL and gloo unless the spec's env names one itself;
    `interconnect_floor` the gang's all-reduce floor in GB/s (`node_outcome.interconnect_floor`: None, no check)."""
    env = dict(doc["env"])
    env.update(doc["trainer_env"])
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
            "GPUJOBS_CHECKPOINT_MODE": doc["checkpoint_mode"],
            "GPUJOBS_EVENT_BUS": doc["event_bus"],
            "GPUJOBS_INSTANCE_ID": instance_id,
            "AWS_REGION": region,
            "AWS_DEFAULT_REGION": region,
        }
    )
    if doc["report_key"]:  # the trainer signs its reports with it (gpujobs.domain.report_auth)
        env[REPORT_KEY_ENV] = doc["report_key"]
    if doc.get("checkpoint_key"):  # ... and the job's checkpoints with this one
        env[CHECKPOINT_KEY_ENV] = doc["checkpoint_key"]
    if doc["code_uri"]:  # the launcher unpacks it before the command starts
        env.update(GPUJOBS_CODE_URI=doc["code_uri"], GPUJOBS_CODE_SHA256=doc["code_sha256"])
    if doc["setup"]:  # the launcher runs them in the container before the command
        env["GPUJOBS_SETUP"] = json.dumps(doc["setup"])
    if doc["requirements"]:  # ... after installing this file of the code into a cached venv
        env.update(GPUJOBS_REQUIREMENTS=doc["requirements"], GPUJOBS_VENV_CACHE_URI=doc["venv_cache_uri"])
    if doc["resume_from_step"] is not None:
        env["GPUJOBS_RESUME_FROM_STEP"] = str(doc["resume_from_step"])
    if output_dir:
        env[OUTPUT_DIR_ENV] = output_dir
    if staging_dir:
        env["GPUJOBS_LOCAL_CHECKPOINT_DIR"] = staging_dir
    if instance_type:
        env["GPUJOBS_INSTANCE_TYPE"] = instance_type
    if interconnect_floor is not None:  # the launcher measures the gang's all-reduce before the job's code runs
        env[INTERCONNECT_FLOOR_ENV] = f"{interconnect_floor:.3f}"
    if socket_interface:
        for name in SOCKET_INTERFACE_ENVS:
            env.setdefault(name, socket_interface)
    return env
