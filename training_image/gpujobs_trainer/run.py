"""The few calls a training script makes: ``init``, ``resume``, ``step_done``, ``finish``.

``step_done`` is the step boundary where everything happens: the local stop/checkpoint requests and
rank 0's periodic timer are combined with one all_reduce(MAX), so every rank saves the same step
and every rank stops at the same step; requests that arrive together make one save (`coalescing`).
That all_reduce and the final barrier run on the trainer's own gloo group, each bounded by the job's
collective timeout; the script's collectives keep torch's default timeout
(``distributed.ControlGroup``). ``busy()`` marks a long phase between two step boundaries, so the
control plane does not take it for a hang (``heartbeat``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from gpujobs_trainer.checkpoint import CheckpointManager
from gpujobs_trainer.coalescing import SaveCoordinator, Verdict
from gpujobs_trainer.config import TrainerConfig
from gpujobs_trainer.distributed import ControlGroup, DistEnv, autocast, init_process_group_from_env
from gpujobs_trainer.errors import (
    CONFIG_ERROR_EXIT_CODE,
    CRASH_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    SUCCESS_EXIT_CODE,
    ConfigError,
    TrainerError,
)
from gpujobs_trainer.events import CHECKPOINT_COMMITTED, NullPublisher, Publisher, make_publisher
from gpujobs_trainer.extra_state import ExtraState
from gpujobs_trainer.heartbeat import Heartbeat
from gpujobs_trainer.interruption import ImdsClient, ImdsWatcher, StopFlags, install_signal_handlers
from gpujobs_trainer.layout import CommitMarker, Reason
from gpujobs_trainer.outcome import WorkerOutcome, write_outcome
from gpujobs_trainer.outputs import request_upload
from gpujobs_trainer.stack_dumps import install_faulthandler
from gpujobs_trainer.state_io import TrainingState
from gpujobs_trainer.storage import open_store

log = logging.getLogger("gpujobs_trainer")


@dataclass(frozen=True)
class ResumePoint:
    """Where training continues: the next step to run and the data position to continue from."""

    step: int
    epoch: int = 0
    offset: int = 0
    checkpoint_uri: str | None = None
    skipped: tuple[str, ...] = ()
    """Newer committed steps that were not resumed from, each with why (unsigned, another job's,
    files that differ from the marker, fails to load)."""


class Run:
    """One training attempt of one worker. Create it with :func:`init`."""

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None,
        config: TrainerConfig,
        env: DistEnv,
        samples_per_step: int | None,
        publisher: Publisher,
        extras: ExtraState | None = None,
    ) -> None:
        self.config = config
        self.env = env
        self.samples_per_step = samples_per_step
        self.flags = StopFlags()
        self.publisher = publisher
        self._control = ControlGroup(config.collective_timeout_seconds)
        store = open_store(config.checkpoint_uri, local_dir=config.local_checkpoint_dir)
        store.check_reachable()
        self.checkpoints = CheckpointManager(
            store=store,
            env=env,
            state=TrainingState(model, optimizer, scheduler, extras),
            keep=config.keep_checkpoints,
            job_id=config.job_id,
            attempt=config.attempt,
            key=config.checkpoint_key,
            on_commit=self._report_commit if env.is_main else None,
        )
        install_signal_handlers(self.flags)
        self.coordinator = SaveCoordinator(self.flags, all_reduce_max=self._control.all_reduce_max)
        self.watcher: ImdsWatcher | None = None
        if env.local_rank == 0 and config.imds_mode != "off":
            self.watcher = ImdsWatcher(
                ImdsClient(config.imds_endpoint),
                self.flags,
                interval=config.imds_poll_seconds,
                required=config.imds_mode == "required",
            )
            self.watcher.start()
        self.step = 0
        self.position: dict[str, int] = {"epoch": 0, "offset": 0}
        self.preempted = False
        self.exit_code: int | None = None
        self._last_periodic = time.monotonic()
        self.heartbeat = Heartbeat(
            publisher=publisher,
            job_id=config.job_id,
            attempt=config.attempt,
            interval=config.heartbeat_seconds,
            samples_per_step=samples_per_step,
            enabled=env.is_main and not isinstance(publisher, NullPublisher),
        )

    # ---- the calls a training script makes --------------------------------------------------
    def resume(self) -> ResumePoint:
        """Restore the newest committed checkpoint, if any. Fails loudly on an unusable one."""
        try:
            marker = self.checkpoints.restore()
        except TrainerError as exc:
            _fatal(exc, rank=self.env.rank, outcome_dir=self.config.outcome_dir)
        if marker is None:
            log.info("no committed checkpoint at %s: starting at step 0", self.config.checkpoint_uri)
            return ResumePoint(step=0)
        self.step = marker.step
        self.position = dict(marker.position)
        self.heartbeat.restart_at(marker.step)
        uri = self.checkpoints.store.step_uri(marker.step)
        skipped = tuple(self.checkpoints.skipped)
        log.info(
            "resumed from %s (step %d, saved %s)%s",
            uri,
            marker.step,
            marker.reason,
            f", skipping newer: {'; '.join(skipped)}" if skipped else "",
        )
        return ResumePoint(
            step=marker.step,
            epoch=marker.position.get("epoch", 0),
            offset=marker.position.get("offset", 0),
            checkpoint_uri=uri,
            skipped=skipped,
        )

    def step_done(
        self, step: int, *, epoch: int = 0, offset: int = 0, metrics: Mapping[str, object] | None = None
    ) -> bool:
        """Record that ``step`` steps are complete and the data position to continue from, and
        ``metrics`` as ``log`` does.

        Returns True when training must stop now (preempted: the checkpoint is already
        committed); the script then calls ``finish()`` and exits with its code.
        """
        if metrics:
            self.heartbeat.record(metrics)
        with self._config_errors_exit():
            return self._step_done(step, epoch=epoch, offset=offset)

    def _step_done(self, step: int, *, epoch: int, offset: int) -> bool:
        self.step = step
        self.position = {"epoch": epoch, "offset": offset}
        now = time.monotonic()
        minutes = self.config.checkpoint_every_minutes
        periodic_due = self.env.is_main and minutes > 0 and now - self._last_periodic >= minutes * 60
        verdict = self.coordinator.at_step(
            step,
            periodic_due=periodic_due,
            every_steps=self.config.checkpoint_every_steps,
            save_in_flight=self.checkpoints.save_in_flight,
        )
        if verdict is Verdict.JOIN and self._joined_save_committed(step):
            return True
        if verdict in (Verdict.STOP, Verdict.JOIN):
            log.info("stopping at step %d: %s", step, self.flags.preempt_reason or "another rank was told to")
            self.preempted = True
            result = self.checkpoints.save(step=step, reason="preempted", position=self.position, blocking=True)
            self.exit_code = PREEMPTED_EXIT_CODE if result.result().committed else CRASH_EXIT_CODE
            return True
        if verdict is Verdict.SAVE_ON_DEMAND:
            self._save("on-demand")
        elif verdict is Verdict.SAVE_PERIODIC:
            self._save("periodic")
        self.heartbeat.after_step(step)
        return False

    def log(self, **metrics: object) -> None:
        """Report metrics (``run.log(loss=loss, lr=lr)``): rank 0's next heartbeat carries the newest
        value of each, shown by ``gpujobs status`` and kept for ``gpujobs metrics``. Floats or 0-d
        tensors (a tensor's value is read on rank 0 only, once per call: a device sync), at most 8
        names; a value that is not a finite number is dropped with a warning. Other ranks: a no-op."""
        self.heartbeat.record(metrics)

    def busy(self, what: str = "busy") -> contextlib.AbstractContextManager[None]:
        """Mark a long phase between two step boundaries (an evaluation, a blocking save, a
        compile): rank 0 keeps reporting heartbeats while it runs, so the control plane does not
        take the job for hung. Call it on any rank; only rank 0 reports. ``what`` labels the
        heartbeats. Wrap a phase that ends, never the training loop (see ``heartbeat``)."""
        return self.heartbeat.busy(what)

    def checkpoint_now(self) -> None:
        """Ask for an on-demand checkpoint at the next step boundary (same as SIGUSR1)."""
        self.flags.request_checkpoint()

    def export(self, model: nn.Module, name: str = "model.safetensors") -> Path | None:
        """Write the model's consolidated weights to ``name`` in the output folder (``$GPUJOBS_OUTPUT_DIR``).

        Collective: every rank calls it; rank 0 writes (safetensors for a ``.safetensors`` name, else
        torch.save) and gets the path, the others None. Works for DDP and FSDP2. The folder is uploaded
        to ``outputs/<job-id>/`` when the job ends, or sooner with ``save_outputs()``.
        """
        relative = PurePath(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.name:
            raise ValueError(f"export name {name!r} must be a path inside the output folder")
        # Imported here: `python -m gpujobs_trainer.export` must find the module not yet imported by the package.
        from gpujobs_trainer.export import export_model

        metadata = {"step": str(self.step), "job_id": self.config.job_id, "attempt": str(self.config.attempt)}
        return export_model(model, Path(self.config.output_dir) / relative, is_main=self.env.is_main, metadata=metadata)

    def save_outputs(self) -> None:
        """Ask for the output folder to be uploaded now (within seconds), not only when the job ends.

        Any rank may call it; each node uploads its own folder. Outside gpujobs it does nothing."""
        request_upload(Path(self.config.output_dir))

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """bf16 autocast on GPU, fp32 on CPU."""
        with autocast(self.env.device):
            yield

    def finish(self) -> int:
        """Final checkpoint (unless preempted), tear down, and return the exit code to use."""
        if self.exit_code is None or not self.preempted:
            code = SUCCESS_EXIT_CODE
            try:
                with self._config_errors_exit(), self.busy("final checkpoint"):
                    self.checkpoints.wait()
                    result = self.checkpoints.save(
                        step=self.step, reason="final", position=self.position, blocking=True
                    )
                if not result.result().committed:
                    code = CRASH_EXIT_CODE
            except Exception as exc:
                log.error("final checkpoint failed: %s", exc)
                code = CRASH_EXIT_CODE
            self.exit_code = code
        self.checkpoints.close()
        if self.watcher is not None:
            self.watcher.stop()
        self.publisher.close()
        reason = {SUCCESS_EXIT_CODE: "succeeded", PREEMPTED_EXIT_CODE: "preempted"}.get(self.exit_code, "failed")
        write_outcome(
            self.config.outcome_dir,
            WorkerOutcome(rank=self.env.rank, exit_code=self.exit_code, reason=reason, step=self.step),
        )
        if dist.is_initialized():
            self._control.barrier()
            dist.destroy_process_group()
        return self.exit_code

    # ---- internals --------------------------------------------------------------------------
    @contextlib.contextmanager
    def _config_errors_exit(self) -> Iterator[None]:
        """A save that finds the script's configuration wrong (shared state that differs across
        ranks: `rank_agreement`) ends this worker with exit 78 and the reason, as `init` does: every
        rank finds the same difference, so all stop together."""
        try:
            yield
        except ConfigError as exc:
            _fatal(exc, rank=self.env.rank, outcome_dir=self.config.outcome_dir)

    def _save(self, reason: Reason) -> None:
        self._last_periodic = time.monotonic()
        blocking = not self.config.async_checkpoints
        started = self.coordinator.clock()
        with self.busy("checkpoint") if blocking else contextlib.nullcontext():
            self.checkpoints.save(step=self.step, reason=reason, position=self.position, blocking=blocking)
        self.coordinator.saved(self.step, started=started)

    def _joined_save_committed(self, step: int) -> bool:
        """A preemption right after a save started: stop now with that save as the preemption
        checkpoint, once it is committed (every rank learns the same outcome). False when it failed:
        the caller saves this step instead."""
        joined = self.coordinator.last_save_step
        self.checkpoints.wait()
        if joined is None or self.checkpoints.last_committed_step != joined:
            return False
        log.info(
            "stopping at step %d: %s; the checkpoint of step %d, started just before, is the preemption checkpoint",
            step,
            self.flags.preempt_reason or "another rank was told to",
            joined,
        )
        self.preempted = True
        self.exit_code = PREEMPTED_EXIT_CODE
        return True

    def _report_commit(self, marker: CommitMarker, uri: str) -> None:
        self.publisher.publish(
            CHECKPOINT_COMMITTED,
            {
                "job_id": self.config.job_id,
                "attempt": self.config.attempt,
                "step": marker.step,
                "uri": uri,
                "reason": marker.reason,
            },
        )


def init(
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None = None,
    samples_per_step: int | None = None,
    config: TrainerConfig | None = None,
    state: Mapping[str, Any] | None = None,
) -> Run:
    """Set up distributed training, checkpointing, interruption handling and reporting.

    ``model`` is the (DDP-wrapped) module being trained; ``samples_per_step`` (global batch) only
    feeds the heartbeat. ``state`` names further objects to checkpoint with the model (a
    GradScaler, an EMA, a StatefulDataLoader, ...; see `extra_state`). A bad environment,
    checkpoint location or ``state`` entry exits with code 78 here, naming the problem, before
    any training step runs.
    """
    _configure_logging()
    rank = int(os.environ.get("RANK", "0") or 0)
    install_faulthandler(os.environ, rank=rank)  # first: a hang in the process group's setup is dumped too
    outcome_dir = os.environ.get("GPUJOBS_OUTCOME_DIR", "")
    try:
        config = config or TrainerConfig.from_env()
        env = init_process_group_from_env()
        publisher = make_publisher(config.event_bus) if env.is_main else NullPublisher()
        return Run(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            config=config,
            env=env,
            samples_per_step=samples_per_step,
            publisher=publisher,
            extras=ExtraState(state or {}, rank=env.rank),
        )
    except TrainerError as exc:
        _fatal(exc, rank=rank, outcome_dir=outcome_dir)


def setup_distributed() -> DistEnv:
    """Initialise the process group from the torchrun environment (exit 78 if it is missing)."""
    _configure_logging()
    try:
        return init_process_group_from_env()
    except TrainerError as exc:
        _fatal(exc, rank=int(os.environ.get("RANK", "0") or 0), outcome_dir=os.environ.get("GPUJOBS_OUTCOME_DIR", ""))


def _fatal(exc: TrainerError, *, rank: int, outcome_dir: str) -> NoReturn:
    log.error("gpujobs_trainer: %s", exc)
    write_outcome(
        outcome_dir, WorkerOutcome(rank=rank, exit_code=CONFIG_ERROR_EXIT_CODE, reason="config-error", message=str(exc))
    )
    raise SystemExit(CONFIG_ERROR_EXIT_CODE) from exc


def _configure_logging() -> None:
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    rank = os.environ.get("RANK", "?")
    handler.setFormatter(logging.Formatter(f"[gpujobs rank {rank}] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(os.environ.get("GPUJOBS_LOG_LEVEL", "INFO").upper())
    log.propagate = False
