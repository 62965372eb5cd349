"""The restoring half of the checkpoint manager: which committed step to resume from, and loading it.

Newest first, a committed step is resumed from only when its marker is this job's (signed with the
job's key when it has one, naming this job, listing only checkpoint files), its files are exactly
those listed with their sizes and digests, and it loads; any step that fails one of these is
skipped, logged with the reason and kept in ``skipped``, for the next older one. Committed steps
of which none passes stop the job (CheckpointError, exit 78): it never silently starts over.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from gpujobs_trainer.distributed import DistEnv
from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.layout import (
    DCP_METADATA_FILE,
    CommitMarker,
    provenance_problems,
    resume_candidates,
    rng_file_name,
)
from gpujobs_trainer.rng import restore_rng_states
from gpujobs_trainer.safe_load import SafeLoadPlanner, SafeReader, load_metadata
from gpujobs_trainer.state_io import EXTRAS_KEY, TrainingState
from gpujobs_trainer.storage import CheckpointStore

log = logging.getLogger("gpujobs_trainer")
_T = TypeVar("_T")


class Restoring:
    """Mixed into `checkpoint.CheckpointManager`, which sets these attributes."""

    store: CheckpointStore
    env: DistEnv
    state: TrainingState
    job_id: str
    key: bytes
    skipped: list[str]
    last_committed_step: int | None
    last_commit: CommitMarker | None
    _group: Any

    def wait_idle(self) -> None:
        raise NotImplementedError

    def restore(self) -> CommitMarker | None:
        """Load the newest committed checkpoint that is ours and loads; None when there is none.

        A step whose marker is malformed, unsigned or another job's, whose files differ from what it
        records, or that fails to load is skipped (logged, and kept in `skipped`) for the next older
        one. Never silently starts from scratch: when committed steps exist but none passes, every
        rank raises CheckpointError."""
        self.wait_idle()
        self.skipped = []
        candidates = self._shared(self._committed_markers)
        for step, marker, listed_problem in candidates:
            problem = listed_problem
            if marker is not None and not problem:
                problem = self._shared_ok(functools.partial(self._fetch, marker))
            if marker is not None and not problem:
                problem = self._shared_ok(functools.partial(self._load, marker))
            if marker is None or problem:
                self._skip(step, problem)
                continue
            self.last_committed_step = step
            self.last_commit = marker
            return marker
        if candidates:
            raise CheckpointError(
                f"no usable checkpoint at {self.store.uri}: committed steps all skipped: {'; '.join(self.skipped)}"
            )
        return None

    def _skip(self, step: int, problem: str) -> None:
        self.skipped.append(f"step {step}: {problem}")
        if self.env.is_main:
            log.warning("skipping checkpoint step %d: %s", step, problem)

    def _load(self, marker: CommitMarker) -> None:
        """Load the verified step into the live objects (collective: every rank calls it)."""
        folder = self.store.staging_dir(marker.step)
        same_ranks = marker.world_size == self.env.world_size
        planner = SafeLoadPlanner()
        try:
            template = {"app": self.state.load_template(per_rank=same_ranks)}
            dcp_load(template, storage_reader=SafeReader(folder), planner=planner, process_group=self._group)
            self.state.load_state_dict(template["app"])
            self._restore_rng(marker, folder)
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(f"it is committed but does not load: {summary(exc)}") from exc
        _warn_unloaded_extras(planner.unloaded, rank=self.env.rank)

    def _committed_markers(self) -> list[tuple[int, CommitMarker | None, str]]:
        """Committed steps, newest first, each with its marker (None if unreadable) and why it
        cannot be trusted ('' when it can, as far as the marker itself tells)."""
        listing = self.store.listing()
        if listing.uncommitted:
            log.warning(
                "ignoring checkpoint folders without COMMIT.json (saves cut short): steps %s",
                ", ".join(str(s) for s in listing.uncommitted),
            )
        candidates: list[tuple[int, CommitMarker | None, str]] = []
        for step in resume_candidates(listing):
            try:
                marker = self.store.read_commit(step)
            except CheckpointError as exc:
                candidates.append((step, None, str(exc)))
                continue
            problems = provenance_problems(marker, step=step, job_id=self.job_id, key=self.key)
            candidates.append((step, marker, "; ".join(problems)))
        return candidates

    def _fetch(self, marker: CommitMarker) -> None:
        """Verify the step's files (downloading them first from S3) and that its DCP metadata
        loads safely and points only into listed shards; once per node."""
        if self.env.local_rank == 0:
            folder = self.store.fetch(marker.step, marker)
            load_metadata(folder / DCP_METADATA_FILE, shard_files=marker.files)

    def _restore_rng(self, marker: CommitMarker, folder: Path) -> None:
        path = folder / rng_file_name(self.env.rank)
        if marker.world_size != self.env.world_size or not path.is_file():
            log.warning(
                "checkpoint step %d was saved by %d ranks, now %d: RNG states and per-rank state not restored",
                marker.step,
                marker.world_size,
                self.env.world_size,
            )
            return
        restore_rng_states(json.loads(path.read_text(encoding="utf-8")))

    def _shared(self, produce: Callable[[], list[_T]]) -> list[_T]:
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
        result: list[_T] = value
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


def _warn_unloaded_extras(keys: tuple[str, ...], *, rank: int) -> None:
    """Saved values of ``init(state=...)`` objects whose fresh ``state_dict()`` lacks their keys
    (keys that appear as training runs): DCP does not load them, so the resume is not exact."""
    lost = [key for key in keys if key.startswith(f"app.{EXTRAS_KEY}.")]
    if lost and rank == 0:
        log.warning(
            "checkpoint values not restored, because the state_dict() of the object given to "
            "init(state=...) has no such keys before training (give it a fixed key set): %s",
            ", ".join(lost[:10]) + (" ..." if len(lost) > 10 else ""),
        )


def summary(exc: BaseException) -> str:
    """One line per failing rank instead of DCP's multi-rank traceback dump."""
    if isinstance(exc, CheckpointException):
        parts = []
        for rank, failure in sorted(exc.failures.items()):
            inner = failure[0] if isinstance(failure, tuple) else failure
            first = (str(inner).strip().splitlines() or [""])[0]
            parts.append(f"rank {rank}: {type(inner).__name__}: {first}")
        return "; ".join(parts)
    return f"{type(exc).__name__}: {exc}"
