"""The checkpoint manager: DCP save/restore of everything a resumed run needs, committed by a
marker written last.

Design choices, each from a failure seen or documented (see docs/training.md):
- Model and optimizer go through ``get_state_dict``/``set_state_dict``. An in-place ``dcp.load``
  into ``optimizer.state_dict()`` of a fresh optimizer silently drops Adam's moments (there are no
  tensors to load into yet).
- Saves run on a dedicated gloo process group: ``dcp.async_save`` on the training group hangs.
- At most one save is in flight; the next save, a restore and shutdown wait for it.
- Rank 0 writes COMMIT.json only after every rank reported its files written (and uploaded), then
  purges older checkpoints in the background, always keeping at least two committed ones.
- Asynchronous saves copy the state into host buffers kept between saves (no page faults per
  save) on a background thread. Only tensors that nothing but ``optimizer.step()`` changes
  (parameters, optimizer state) are copied there; everything else (buffers, scheduler) is copied
  before ``save`` returns, and an optimizer step pre-hook waits for the copy to finish.
- torch.save's per-record CRC32 is skipped while DCP writes shards: torch.load never checks it,
  and computing it cost ~0.7 s per GB on one core. Instead each file's BLAKE3 digest is computed as
  it is written and recorded in COMMIT.json, with the job and attempt, and the marker is signed
  with the job's checkpoint key when it has one.
- A checkpoint is trusted only if it is ours: before loading, its marker must be signed with this
  job's key (when it has one), name this job and its folder hold exactly the listed files with
  their sizes and digests; one that fails, or that fails to load, is skipped for the next older
  committed one (logged, and kept in `skipped`). Loading itself never unpickles arbitrary objects
  (`safe_load`): without a key, whoever can plant files can also write a matching marker.
- A save needs the process group: after ``destroy_process_group()`` (Accelerate's
  ``end_training()``) DCP would write every rank's files as rank 0's into one folder; such a save
  fails at once, before anything is written, and commits nothing.
- Shared script state (``init(state=...)``) is compared across ranks before every save
  (`rank_agreement`): DCP would keep one rank's copy of it, so one that differs by rank is a
  configuration error naming it, never a silently collapsed checkpoint.

What a checkpoint holds and how its shards are written live in `state_io`; this module decides when
to save, commits, purges and restores.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from gpujobs_trainer.buffers import take_buffers_from_rank0
from gpujobs_trainer.checkpoint_restore import Restoring, summary
from gpujobs_trainer.digests import DEFAULT_ALGORITHM
from gpujobs_trainer.distributed import DistEnv
from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.layout import (
    DCP_METADATA_FILE,
    CommitMarker,
    Reason,
    is_rank_file,
    rng_file_name,
    steps_to_purge,
)
from gpujobs_trainer.rank_agreement import check_shared_state_agrees
from gpujobs_trainer.rng import capture_rng_states
from gpujobs_trainer.state_io import (
    EXTRAS_KEY,
    WRITER_THREADS,
    ShardWriter,
    TrainingState,
    optimizer_owned,
    snapshot_mutables,
)
from gpujobs_trainer.storage import CheckpointStore, S3Store, local_sizes, write_durably

__all__ = ["CheckpointManager", "SaveResult", "TrainingState"]

log = logging.getLogger("gpujobs_trainer")


@dataclass(frozen=True)
class SaveResult:
    step: int
    committed: bool
    seconds: float


@dataclass(frozen=True)
class _Save:
    """One save in progress: what it is for, and the digest of each file this rank wrote for it
    (``digests`` is filled while the shards are written)."""

    step: int
    reason: Reason
    position: Mapping[str, int]
    started: float
    digests: Mapping[str, str]
    digest_algorithm: str


CommitListener = Callable[[CommitMarker, str], None]
_T = TypeVar("_T")


class CheckpointManager(Restoring):
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
        key: bytes = b"",
        on_commit: CommitListener | None = None,
        digest: str = DEFAULT_ALGORITHM,
    ) -> None:
        self.store = store
        self.env = env
        self.state = state
        self.keep = max(2, keep)
        self.job_id = job_id
        self.attempt = attempt
        self.key = key
        """The job's checkpoint key: markers are signed with it, and must be to be resumed from."""
        self.digest = digest
        self.on_commit = on_commit
        self.skipped: list[str] = []
        """Committed steps the last restore skipped, each with why."""
        self.last_committed_step: int | None = None
        self.last_commit: CommitMarker | None = None
        # Checkpoint traffic never shares the training group: async_save on it hangs the job.
        self._group = dist.new_group(backend="gloo")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpujobs-checkpoint")
        self._housekeeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpujobs-purge")
        self._in_flight: Future[SaveResult] | None = None
        self._housekeeping: Future[None] | None = None
        self._saving_step: int | None = None
        # Asynchronous saves stage into host buffers that are reused from one save to the next
        # (pinned on GPU machines, for fast non-blocking device-to-host copies).
        on_gpu = env.device.type == "cuda" and torch.cuda.is_available()
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=on_gpu,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=on_gpu,
            )
        )
        self._staged: Future[None] | None = None
        self.last_staging_wait_s = 0.0  # how long the last optimizer step waited for staging
        self._step_hook = state.optimizer.register_step_pre_hook(self._wait_for_staging)

    # ---- saving -------------------------------------------------------------------------------
    def save(self, *, step: int, reason: Reason, position: Mapping[str, int], blocking: bool) -> Future[SaveResult]:
        """Start a checkpoint of ``step``; with ``blocking`` it is committed (or failed) on return.
        CheckpointError, with nothing written, when the process group is gone."""
        if not dist.is_initialized():
            raise CheckpointError(
                f"cannot save step {step}: the process group is gone (destroy_process_group() ran first, as "
                "Accelerate's end_training() does: call run.finish() before it); nothing was written or committed"
            )
        self.wait()
        started = time.monotonic()
        if step == self.last_committed_step:
            done: Future[SaveResult] = Future()
            done.set_result(SaveResult(step, True, 0.0))
            return done
        folder = self.store.staging_dir(step)
        self._saving_step = step  # never purged while it is being written
        if self.env.local_rank == 0:
            shutil.rmtree(folder, ignore_errors=True)  # leftovers of a save cut short
            folder.mkdir(parents=True, exist_ok=True)
        dist.barrier(group=self._group)
        writer = ShardWriter(str(folder), thread_count=WRITER_THREADS, digest=self.digest)
        rng_file = rng_file_name(self.env.rank)
        writer.digests[rng_file] = write_durably(folder / rng_file, json.dumps(capture_rng_states()), self.digest)
        pending = _Save(step, reason, position, started, writer.digests, self.digest)
        state = self.state.state_dict()
        if EXTRAS_KEY in state:
            check_shared_state_agrees(state[EXTRAS_KEY], group=self._group)
        take_buffers_from_rank0(self.state.model, state["model"], group=self._group)
        if blocking:
            future: Future[SaveResult] = Future()
            try:
                dcp_save({"app": state}, storage_writer=writer, process_group=self._group)
                error = None
            except (Exception, CheckpointException) as exc:  # reported below, collectively
                error = exc
            future.set_result(self._complete(pending, error))
            return future
        if self.env.device.type == "cuda":
            # the staging stream must not read parameters that queued kernels still update
            torch.cuda.current_stream(self.env.device).synchronize()
        payload = {"app": snapshot_mutables(state, optimizer_owned(self.state.optimizer))}
        response = dcp_async_save(payload, storage_writer=writer, process_group=self._group, async_stager=self._stager)
        if isinstance(response, AsyncSaveResponse):
            self._staged, upload = response.staging_completion, response.upload_completion
        else:  # a stager that staged synchronously
            upload = response
        self._in_flight = self._executor.submit(self._finish_async, upload, pending)
        return self._in_flight

    def _wait_for_staging(self, *_: Any) -> None:
        """Optimizer step pre-hook: parameters and optimizer state may change only once the
        background copy of the asynchronous save in flight has them."""
        staged, self._staged = self._staged, None
        if staged is None:
            return
        started = time.monotonic()
        with contextlib.suppress(Exception):  # a staging failure fails the save, not the step
            staged.result()
        self.last_staging_wait_s = time.monotonic() - started

    def _finish_async(self, upload: Future[Any], pending: _Save) -> SaveResult:
        error: BaseException | None = None
        try:
            upload.result()
        except (Exception, CheckpointException) as exc:
            error = exc
        return self._complete(pending, error)

    def _complete(self, pending: _Save, error: BaseException | None) -> SaveResult:
        """Upload this rank's files, agree that every rank succeeded, then rank 0 commits."""
        step = pending.step
        folder = self.store.staging_dir(step)
        mine: dict[str, tuple[int, str]] = {}
        if error is None:
            try:
                mine = {
                    n: (s, pending.digests[n]) for n, s in local_sizes(folder).items() if is_rank_file(n, self.env.rank)
                }
                self.store.publish(step, sorted(mine))
            except Exception as exc:
                error = exc
        if error is not None:
            log.error("rank %d: checkpoint step %d failed: %s", self.env.rank, step, summary(error))
        reports: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(reports, (error is None, mine), group=self._group)
        marker: CommitMarker | None = None
        if self.env.is_main and all(ok for ok, _ in reports):
            try:
                marker = self._commit(pending, reports)
            except Exception as exc:
                log.error("checkpoint step %d could not be committed: %s", step, exc)
        committed = [marker is not None]
        dist.broadcast_object_list(committed, src=0, group=self._group)
        seconds = time.monotonic() - pending.started
        if committed[0]:
            self.last_committed_step = step
            self._after_commit(marker, step)
        return SaveResult(step, bool(committed[0]), seconds)

    def _commit(self, pending: _Save, reports: list[Any]) -> CommitMarker:
        step = pending.step
        self.store.publish(step, [DCP_METADATA_FILE])
        written: dict[str, tuple[int, str]] = {}
        for _, files in reports:
            written.update(files)
        written[DCP_METADATA_FILE] = (
            (self.store.staging_dir(step) / DCP_METADATA_FILE).stat().st_size,
            pending.digests[DCP_METADATA_FILE],
        )
        marker = CommitMarker(
            step=step,
            world_size=self.env.world_size,
            torch_version=torch.__version__,
            reason=pending.reason,
            files={name: size for name, (size, _) in written.items()},
            digests={name: digest for name, (_, digest) in written.items()},
            time=datetime.now(UTC).isoformat(timespec="milliseconds"),
            position=dict(pending.position),
            job_id=self.job_id,
            attempt=self.attempt,
            digest_algorithm=pending.digest_algorithm,
        ).signed(self.key)
        self.store.write_commit(marker)
        return marker

    def _after_commit(self, marker: CommitMarker | None, step: int) -> None:
        if marker is not None:  # rank 0
            self.last_commit = marker
            log.info("checkpoint step %d committed (%s) at %s", step, marker.reason, self.store.step_uri(step))
            if self.on_commit is not None:
                self.on_commit(marker, self.store.step_uri(step))
        # Deleting a GB-sized old checkpoint takes a while: the committed save does not wait for
        # it (it only ever deletes steps older than this commit); a restore and close() do.
        self._housekeeping = self._housekeeper.submit(self._purge, marker is not None, step)

    def _purge(self, main: bool, step: int) -> None:
        try:
            if isinstance(self.store, S3Store) and self.env.local_rank == 0:
                self.store.prune_staging(keep_step=step)
            if main:
                busy = [] if self._saving_step is None else [self._saving_step]
                for old in steps_to_purge(self.store.listing(), keep=self.keep, in_flight=busy):
                    self.store.delete(old)
        except Exception as exc:  # retention is housekeeping: never fail training over it
            log.warning("purging old checkpoints failed: %s", exc)

    @property
    def save_in_flight(self) -> bool:
        """Whether an asynchronous save is still being written or committed (on this rank)."""
        return self._in_flight is not None and not self._in_flight.done()

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is committed or failed."""
        if self._in_flight is None:
            return None
        future, self._in_flight = self._in_flight, None
        self._staged = None
        return future.result()

    def wait_idle(self) -> None:
        """Block until the save in flight and the purge after the last commit are done. A save
        need not wait for the purge: it never touches steps newer than the commit it follows."""
        self.wait()
        if self._housekeeping is not None:
            housekeeping, self._housekeeping = self._housekeeping, None
            housekeeping.result()

    def close(self) -> None:
        self.wait_idle()
        self._executor.shutdown(wait=True)
        self._housekeeper.shutdown(wait=True)
        self._stager.close()
        self._step_hook.remove()
