"""The environment contract between the bootstrap (or a test) and the trainer runtime.

Everything the runtime needs is read once, here, into a frozen dataclass; no other module reads
``os.environ`` for ``GPUJOBS_*`` settings, so the full contract is visible in one place and is
documented in ``docs/training.md``. A job sets the tunable ones in its spec's ``trainer:`` section
(collective timeout, checkpoint every N steps, checkpoints kept, async saves, compile, heartbeat
period, log level); the bootstrap passes those that differ from the defaults below, so each
default here is also the spec's (a test holds the two equal).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpujobs_trainer.errors import ConfigError
from gpujobs_trainer.outputs import DEFAULT_OUTPUT_DIR, OUTPUT_DIR_ENV
from gpujobs_trainer.signing import checkpoint_key_from_env

DEFAULT_IMDS_ENDPOINT = "http://169.254.169.254"


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """Runtime settings, one field per environment variable (named in each comment)."""

    checkpoint_uri: str  # GPUJOBS_CHECKPOINT_URI (required): s3://bucket/prefix, file:///p or /p
    local_checkpoint_dir: str  # GPUJOBS_LOCAL_CHECKPOINT_DIR: staging dir for S3 checkpoints
    checkpoint_every_minutes: float  # GPUJOBS_CHECKPOINT_EVERY_MINUTES (default 10, 0 = off)
    checkpoint_every_steps: int  # GPUJOBS_CHECKPOINT_EVERY_STEPS (default 0 = off)
    keep_checkpoints: int  # GPUJOBS_KEEP_CHECKPOINTS (default 2, never below 2)
    async_checkpoints: bool  # GPUJOBS_ASYNC_CHECKPOINTS (default 1)
    job_id: str  # GPUJOBS_JOB_ID (default "local")
    attempt: int  # GPUJOBS_ATTEMPT (default 0)
    node_rank: int  # GPUJOBS_NODE_RANK (default 0)
    event_bus: str  # GPUJOBS_EVENT_BUS (empty = reporting disabled)
    heartbeat_seconds: float  # GPUJOBS_HEARTBEAT_SECONDS (default 60)
    imds_endpoint: str  # AWS_EC2_METADATA_SERVICE_ENDPOINT (default http://169.254.169.254)
    imds_poll_seconds: float  # GPUJOBS_IMDS_POLL_SECONDS (default 5)
    imds_mode: str  # GPUJOBS_IMDS: auto (default) | required | off
    collective_timeout_seconds: float  # GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS (default 120): the trainer's own group
    compile: bool  # GPUJOBS_COMPILE (default 0)
    outcome_dir: str  # GPUJOBS_OUTCOME_DIR (set by the launcher; empty = no outcome files)
    output_dir: str = DEFAULT_OUTPUT_DIR  # GPUJOBS_OUTPUT_DIR (set by the bootstrap; uploaded to outputs/<job-id>/)
    checkpoint_key: bytes = field(default=b"", repr=False)  # GPUJOBS_CHECKPOINT_KEY (hex; empty = unsigned)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TrainerConfig:
        """Read and validate the contract; raise ConfigError naming the offending variable."""
        source = os.environ if env is None else env
        uri = source.get("GPUJOBS_CHECKPOINT_URI", "").strip()
        if not uri:
            raise ConfigError(
                "GPUJOBS_CHECKPOINT_URI is not set: refusing to train without a checkpoint location "
                "(use s3://bucket/prefix or a local path)"
            )
        imds_mode = source.get("GPUJOBS_IMDS", "auto").strip().lower() or "auto"
        if imds_mode not in {"auto", "required", "off"}:
            raise ConfigError(f"GPUJOBS_IMDS must be auto, required or off, not {imds_mode!r}")
        # An explicitly configured metadata endpoint means "this is the one to watch": keep polling.
        if "AWS_EC2_METADATA_SERVICE_ENDPOINT" in source and imds_mode == "auto":
            imds_mode = "required"
        return cls(
            checkpoint_uri=uri,
            local_checkpoint_dir=source.get("GPUJOBS_LOCAL_CHECKPOINT_DIR", "")
            or os.path.join(tempfile.gettempdir(), "gpujobs-checkpoints"),
            checkpoint_every_minutes=_number(source, "GPUJOBS_CHECKPOINT_EVERY_MINUTES", 10.0),
            checkpoint_every_steps=int(_number(source, "GPUJOBS_CHECKPOINT_EVERY_STEPS", 0)),
            keep_checkpoints=max(2, int(_number(source, "GPUJOBS_KEEP_CHECKPOINTS", 2))),
            async_checkpoints=_flag(source, "GPUJOBS_ASYNC_CHECKPOINTS", default=True),
            job_id=source.get("GPUJOBS_JOB_ID", "") or "local",
            attempt=int(_number(source, "GPUJOBS_ATTEMPT", 0)),
            node_rank=int(_number(source, "GPUJOBS_NODE_RANK", 0)),
            event_bus=source.get("GPUJOBS_EVENT_BUS", "").strip(),
            heartbeat_seconds=_number(source, "GPUJOBS_HEARTBEAT_SECONDS", 60.0),
            imds_endpoint=(source.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "") or DEFAULT_IMDS_ENDPOINT).rstrip("/"),
            imds_poll_seconds=_number(source, "GPUJOBS_IMDS_POLL_SECONDS", 5.0),
            imds_mode=imds_mode,
            collective_timeout_seconds=_number(source, "GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS", 120.0),
            compile=compile_requested(source),
            outcome_dir=source.get("GPUJOBS_OUTCOME_DIR", ""),
            output_dir=source.get(OUTPUT_DIR_ENV, "") or DEFAULT_OUTPUT_DIR,
            checkpoint_key=checkpoint_key_from_env(source),
        )


def compile_requested(env: Mapping[str, str] | None = None) -> bool:
    """GPUJOBS_COMPILE: whether ``prepare_model`` compiles the model (read before ``init``)."""
    return _flag(os.environ if env is None else env, "GPUJOBS_COMPILE", default=False)


def _number(source: Mapping[str, str], name: str, default: float) -> float:
    raw = source.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must not be negative, got {raw!r}")
    return value


def _flag(source: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = source.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name} must be 0 or 1, not {raw!r}")
