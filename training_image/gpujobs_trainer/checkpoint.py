"""The checkpoint manager: DCP save/restore of everything a resumed run needs, committed by a
marker written last.

Design choices, each from a failure seen or documented (see docs/training.md):
- Model and optimizer go through ``get_state_dict``/``set_state_dict``. An in-place ``dcp.load``
  into ``optimizer.state_dict()`` of a fresh optimizer silently drops Adam's moments (there are no
  tensors to load into yet).
- Saves run on a dedicated gloo process group: ``dcp.async_save`` on the training group hangs.
- At most one save is in flight; the next save, a restore and shutdown wait for it.
- Rank 0 writes COMMIT.json only after every rank reported its files written (and uploaded), then
  purges older checkpoints, always keeping at least two committed ones.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.stateful import Stateful

from gpujobs_trainer.distributed import DistEnv
from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.layout import (
    DCP_METADATA_FILE,
    CommitMarker,
    Reason,
    is_rank_file,
    resume_candidates,
    rng_file_name,
    steps_to_purge,
)
from gpujobs_trainer.rng import capture_rng_states, restore_rng_states
from gpujobs_trainer.storage import CheckpointStore, S3Store, local_sizes

log = logging.getLogger("gpujobs_trainer")


class TrainingState(Stateful):
    """Model, optimizer and LR scheduler as one DCP Stateful (FQN-normalised by get_state_dict)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any | None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])


@dataclass(frozen=True)
class SaveResult:
    step: int
    committed: bool
    seconds: float


WRITER_THREADS = 4
CommitListener = Callable[[CommitMarker, str], None]


class CheckpointManager:
    """Saves and restores checkpoints of one TrainingState in one CheckpointStore."""

    def __init__(
        self,
        *,
        store: CheckpointStore,
        env: DistEnv,
        state: TrainingState,
        keep: int = 2,
        job_id: str = "",
        attempt: int = 0,
        on_commit: CommitListener | None = None,
    ) -> None:
        self.store = store
        self.env = env
        self.state = state
        self.keep = max(2, keep)
        self.job_id = job_id
        self.attempt = attempt
        self.on_commit = on_commit
        self.last_committed_step: int | None = None
        self.last_commit: CommitMarker | None = None
        # Checkpoint traffic never shares the training group: async_save on it hangs the job.
        self._group = dist.new_group(backend="gloo")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpujobs-checkpoint")
        self._in_flight: Future[SaveResult] | None = None

    # ---- saving -------------------------------------------------------------------------------
    def save(self, *, step: int, reason: Reason, position: Mapping[str, int], blocking: bool) -> Future[SaveResult]:
        """Start a checkpoint of ``step``; with ``blocking`` it is committed (or failed) on return."""
        self.wait()
        started = time.monotonic()
        if step == self.last_committed_step:
            done: Future[SaveResult] = Future()
            done.set_result(SaveResult(step, True, 0.0))
            return done
        folder = self.store.staging_dir(step)
        if self.env.local_rank == 0:
            shutil.rmtree(folder, ignore_errors=True)  # leftovers of a save cut short
            folder.mkdir(parents=True, exist_ok=True)
        dist.barrier(group=self._group)
        (folder / rng_file_name(self.env.rank)).write_text(json.dumps(capture_rng_states()), encoding="utf-8")
        payload = {"app": self.state}
        if blocking:
            future: Future[SaveResult] = Future()
            try:
                dcp_save(payload, storage_writer=self._writer(folder), process_group=self._group)
                error = None
            except (Exception, CheckpointException) as exc:  # reported below, collectively
                error = exc
            future.set_result(self._complete(step, reason, position, started, error))
            return future
        dcp_future = dcp_async_save(payload, storage_writer=self._writer(folder), process_group=self._group)
        self._in_flight = self._executor.submit(self._finish_async, dcp_future, step, reason, position, started)
        return self._in_flight

    @staticmethod
    def _writer(folder: Any) -> FileSystemWriter:
        # Several writer threads per rank: one thread reached ~45% of the disk's sequential
        # write speed in bench/checkpoint_bench.py, four threads ~90%.
        return FileSystemWriter(str(folder), thread_count=WRITER_THREADS)

    def _finish_async(
        self, dcp_future: Any, step: int, reason: Reason, position: Mapping[str, int], started: float
    ) -> SaveResult:
        error: BaseException | None = None
        try:
            dcp_future.result()
        except (Exception, CheckpointException) as exc:
            error = exc
        return self._complete(step, reason, position, started, error)

    def _complete(
        self,
        step: int,
        reason: Reason,
        position: Mapping[str, int],
        started: float,
        error: BaseException | None,
    ) -> SaveResult:
        """Upload this rank's files, agree that every rank succeeded, then rank 0 commits."""
        folder = self.store.staging_dir(step)
        mine: dict[str, int] = {}
        if error is None:
            try:
                mine = {n: s for n, s in local_sizes(folder).items() if is_rank_file(n, self.env.rank)}
                self.store.publish(step, sorted(mine))
            except Exception as exc:
                error = exc
        if error is not None:
            log.error("rank %d: checkpoint step %d failed: %s", self.env.rank, step, _summary(error))
        reports: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(reports, (error is None, mine), group=self._group)
        marker: CommitMarker | None = None
        if self.env.is_main and all(ok for ok, _ in reports):
            try:
                marker = self._commit(step, reason, position, reports)
            except Exception as exc:
                log.error("checkpoint step %d could not be committed: %s", step, exc)
        committed = [marker is not None]
        dist.broadcast_object_list(committed, src=0, group=self._group)
        seconds = time.monotonic() - started
        if committed[0]:
            self.last_committed_step = step
            self._after_commit(marker, step)
        return SaveResult(step, bool(committed[0]), seconds)

    def _commit(self, step: int, reason: Reason, position: Mapping[str, int], reports: list[Any]) -> CommitMarker:
        self.store.publish(step, [DCP_METADATA_FILE])
        files: dict[str, int] = {}
        for _, sizes in reports:
            files.update(sizes)
        files[DCP_METADATA_FILE] = (self.store.staging_dir(step) / DCP_METADATA_FILE).stat().st_size
        marker = CommitMarker(
            step=step,
            world_size=self.env.world_size,
            torch_version=torch.__version__,
            reason=reason,
            files=files,
            time=datetime.now(UTC).isoformat(timespec="milliseconds"),
            position=dict(position),
            job_id=self.job_id,
            attempt=self.attempt,
        )
        self.store.write_commit(marker)
        return marker

    def _after_commit(self, marker: CommitMarker | None, step: int) -> None:
        if isinstance(self.store, S3Store) and self.env.local_rank == 0:
            self.store.prune_staging(keep_step=step)
        if marker is None:  # not rank 0
            return
        self.last_commit = marker
        log.info("checkpoint step %d committed (%s) at %s", step, marker.reason, self.store.step_uri(step))
        try:
            for old in steps_to_purge(self.store.listing(), keep=self.keep):
                self.store.delete(old)
        except Exception as exc:  # retention is housekeeping: never fail training over it
            log.warning("purging old checkpoints failed: %s", exc)
        if self.on_commit is not None:
            self.on_commit(marker, self.store.step_uri(step))

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is committed or failed."""
        if self._in_flight is None:
            return None
        future, self._in_flight = self._in_flight, None
        return future.result()

    def close(self) -> None:
        self.wait()
        self._executor.shutdown(wait=True)

    # ---- restoring ----------------------------------------------------------------------------
    def restore(self) -> CommitMarker | None:
        """Load the newest committed checkpoint; None when there is none. Never silently skips a
        committed checkpoint that fails to load: that raises CheckpointError on every rank."""
        self.wait()
        candidates = self._shared(self._committed_markers)
        for marker in candidates:
            problem = self._shared_ok(functools.partial(self._fetch, marker))
            if problem:
                log.warning("skipping checkpoint step %d: %s", marker.step, problem)
                continue
            folder = self.store.staging_dir(marker.step)
            try:
                dcp_load({"app": self.state}, checkpoint_id=str(folder), process_group=self._group)
            except (Exception, CheckpointException) as exc:
                raise CheckpointError(
                    f"checkpoint {self.store.step_uri(marker.step)} is committed but corrupt: {_summary(exc)}"
                ) from exc
            self._restore_rng(marker, folder)
            self.last_committed_step = marker.step
            self.last_commit = marker
            return marker
        if candidates:
            steps = ", ".join(str(m.step) for m in candidates)
            raise CheckpointError(
                f"no usable checkpoint at {self.store.uri}: committed steps {steps} all failed verification"
            )
        return None

    def _committed_markers(self) -> list[CommitMarker]:
        listing = self.store.listing()
        if listing.uncommitted:
            log.warning(
                "ignoring checkpoint folders without COMMIT.json (saves cut short): steps %s",
                ", ".join(str(s) for s in listing.uncommitted),
            )
        return [self.store.read_commit(step) for step in resume_candidates(listing)]

    def _fetch(self, marker: CommitMarker) -> None:
        if self.env.local_rank == 0:
            self.store.fetch(marker.step, marker)

    def _restore_rng(self, marker: CommitMarker, folder: Any) -> None:
        path = folder / rng_file_name(self.env.rank)
        if marker.world_size != self.env.world_size or not path.is_file():
            log.warning(
                "checkpoint step %d was saved by %d ranks, now %d: RNG states not restored",
                marker.step,
                marker.world_size,
                self.env.world_size,
            )
            return
        restore_rng_states(json.loads(path.read_text(encoding="utf-8")))

    def _shared(self, produce: Callable[[], list[CommitMarker]]) -> list[CommitMarker]:
        """Run ``produce`` on rank 0 and give every rank its result or its error."""
        box: list[Any] = [None]
        if self.env.is_main:
            try:
                box[0] = ("ok", produce())
            except Exception as exc:
                box[0] = ("error", f"{type(exc).__name__}: {exc}")
        dist.broadcast_object_list(box, src=0, group=self._group)
        status, value = box[0]
        if status == "error":
            raise CheckpointError(f"cannot read checkpoints at {self.store.uri}: {value}")
        result: list[CommitMarker] = value
        return result

    def _shared_ok(self, action: Callable[[], None]) -> str:
        """Run ``action`` on every rank; return the first rank's error message, or ''."""
        try:
            action()
            mine = ""
        except Exception as exc:
            mine = str(exc)
        reports: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(reports, mine, group=self._group)
        return next((r for r in reports if r), "")


def _summary(exc: BaseException) -> str:
    """One line per failing rank instead of DCP's multi-rank traceback dump."""
    if isinstance(exc, CheckpointException):
        parts = []
        for rank, failure in sorted(exc.failures.items()):
            inner = failure[0] if isinstance(failure, tuple) else failure
            first = (str(inner).strip().splitlines() or [""])[0]
            parts.append(f"rank {rank}: {type(inner).__name__}: {first}")
        return "; ".join(parts)
    return f"{type(exc).__name__}: {exc}"
