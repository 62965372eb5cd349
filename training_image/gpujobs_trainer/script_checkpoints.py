"""The launcher's side of ``checkpoint: directory`` and ``checkpoint: none`` (scripts without the library).

Such a script knows nothing of gpujobs' signals, so the launcher does what the trainer library
would do for it:

* ``$GPUJOBS_CHECKPOINT_DIR`` is a fresh local folder; for ``directory`` it is first restored from
  the job's last complete sync and then, on node 0 (whose folder is the job's), kept in S3 while
  the script runs (`directory_sync`);
* SIGUSR1 ("checkpoint now") is never passed on: its default action would kill the script. The
  control plane does not send it to these jobs either (`gpujobs.domain.decisions`);
* for ``directory``, the spot interruption notice (IMDS, as the trainer reads it) is turned into
  SIGTERM for the workers at once, so the script has the notice's two minutes to save; the folder
  is synced once more after they exit, whatever their exit;
* the exit code: 0 when the script succeeded, 75 (preempted, resume me) when it was stopped from
  outside (SIGTERM or the spot notice) and its folder is safely in S3, 74 when either happened but
  the last sync still failed after its retries (the folder in S3 is the previous sync's), 1 otherwise;
* progress, which such a script cannot report itself (`ProgressReports`, node 0): every synced
  manifest is a `Checkpoint Committed` whose step is the manifest's sequence (it only grows, across
  attempts too), and a `Training Heartbeat` goes out every `GPUJOBS_HEARTBEAT_SECONDS` while the
  script runs, with the last sequence (0 for ``none``), so the control plane sees time trained.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpujobs_trainer.config import TrainerConfig
from gpujobs_trainer.directory_sync import DirectorySync, Manifest, local_folder, objects_for
from gpujobs_trainer.errors import (
    CRASH_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    SUCCESS_EXIT_CODE,
    SYNC_FAILED_EXIT_CODE,
    ConfigError,
)
from gpujobs_trainer.events import CHECKPOINT_COMMITTED, TRAINING_HEARTBEAT, NullPublisher, Publisher
from gpujobs_trainer.interruption import ImdsClient, ImdsWatcher, StopFlags
from gpujobs_trainer.outcome import JobOutcome
from gpujobs_trainer.signing import checkpoint_key_from_env
from gpujobs_trainer.sync_manifest import MANIFESTS

log = logging.getLogger("gpujobs_trainer.launch")

GPUJOBS, DIRECTORY, NONE = "gpujobs", "directory", "none"
CHECKPOINT_MODES = (GPUJOBS, DIRECTORY, NONE)
"""The spec's `checkpoint` values, as GPUJOBS_CHECKPOINT_MODE carries them."""
DEFAULT_SYNC_SECONDS = 10.0
DEFAULT_HEARTBEAT_SECONDS = 60.0
SYNC_REASON = "directory-sync"
"""The `reason` of a `Checkpoint Committed` for a synced manifest."""


def checkpoint_mode(env: Mapping[str, str]) -> str:
    """GPUJOBS_CHECKPOINT_MODE (default gpujobs), or ConfigError naming the choices."""
    mode = env.get("GPUJOBS_CHECKPOINT_MODE", "").strip() or GPUJOBS
    if mode not in CHECKPOINT_MODES:
        raise ConfigError(f"GPUJOBS_CHECKPOINT_MODE must be one of {', '.join(CHECKPOINT_MODES)}, not {mode!r}")
    return mode


def script_exit(*, torchrun_code: int, stopped: bool, synced: bool) -> JobOutcome:
    """Pure: the launcher's exit code for a script that reports no outcome files of its own. A last
    sync that failed is said apart (74) when the script itself ended well (succeeded, or stopped
    from outside): a retry of the attempt is for the sync, not for a crash of the script."""
    if not synced:
        if torchrun_code == SUCCESS_EXIT_CODE or stopped:
            return JobOutcome(SYNC_FAILED_EXIT_CODE, "sync-failed", "the last sync of the checkpoint folder failed")
        return JobOutcome(CRASH_EXIT_CODE, "crashed")
    if torchrun_code == SUCCESS_EXIT_CODE:
        return JobOutcome(SUCCESS_EXIT_CODE, "succeeded")
    if stopped:
        return JobOutcome(PREEMPTED_EXIT_CODE, "preempted")
    return JobOutcome(CRASH_EXIT_CODE, "crashed")


class ProgressReports:
    """Node 0's reports for a script without the library: a `Checkpoint Committed` per synced
    manifest and a `Training Heartbeat` every ``interval`` seconds while the script runs."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        job_id: str,
        attempt: int,
        mode: str,
        where: str,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.publisher = publisher
        self.job_id, self.attempt, self.mode, self.where = job_id, attempt, mode, where
        self.interval = interval
        self._clock = clock
        self._started = clock()
        self._last: Manifest | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def committed(self, manifest: Manifest) -> None:
        """A sync wrote ``manifest``: the script's checkpoint, as far as anyone can tell."""
        self._last = manifest
        self.publisher.publish(
            CHECKPOINT_COMMITTED,
            {
                "job_id": self.job_id,
                "attempt": self.attempt,
                "step": manifest.sequence,
                "uri": f"{self.where}{MANIFESTS}/{manifest.name}",
                "reason": SYNC_REASON,
                "time": manifest.time,
                "files": len(manifest.files),
            },
        )

    def restored(self, manifest: Manifest | None) -> None:
        """Where the attempt starts: the heartbeats report its sequence until the next sync."""
        self._last = manifest

    def heartbeat(self) -> None:
        last = self._last
        self.publisher.publish(
            TRAINING_HEARTBEAT,
            {
                "job_id": self.job_id,
                "attempt": self.attempt,
                "step": last.sequence if last is not None else 0,
                "progress": "sync-sequence" if self.mode == DIRECTORY else "none",
                "synced_at": last.time if last is not None else None,
                "running_seconds": round(self._clock() - self._started, 1),
                "source": "launcher",
                "time": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.heartbeat()

        self._started = self._clock()
        self._thread = threading.Thread(target=loop, name="gpujobs-launcher-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.publisher.close()


@dataclass
class ScriptCheckpoints:
    """One attempt's checkpoint folder: restored and synced (``directory``) or just provided (``none``)."""

    mode: str
    folder: Path
    sync: DirectorySync | None = None
    flags: StopFlags | None = None
    watcher: ImdsWatcher | None = None
    reports: ProgressReports | None = None
    final_sync_sleep: Callable[[float], object] = field(default=time.sleep, repr=False)

    @classmethod
    def open(
        cls,
        mode: str,
        env: Mapping[str, str],
        *,
        node_rank: int,
        job_id: str,
        attempt: int,
        publisher: Publisher | None = None,
    ) -> ScriptCheckpoints:
        """The folder, restored for ``directory`` (CheckpointError when the copy is unusable) and
        synced from node 0, whose folder is the job's; every node watches for the spot notice.
        Node 0 reports progress through ``publisher``."""
        folder = local_folder(env)
        interval = _seconds(env, "GPUJOBS_HEARTBEAT_SECONDS", DEFAULT_HEARTBEAT_SECONDS)
        config = TrainerConfig.from_env(env) if mode == DIRECTORY else None
        objects = objects_for(config.checkpoint_uri) if config is not None else None
        reports = None
        if node_rank == 0:
            reports = ProgressReports(
                publisher or NullPublisher(),
                job_id=job_id,
                attempt=attempt,
                mode=mode,
                where=objects.where if objects is not None else "",
                interval=interval,
            )
        if config is None or objects is None:
            return cls(mode, folder, reports=reports)
        sync = DirectorySync(
            folder,
            objects,
            job_id=job_id,
            attempt=attempt,
            key=checkpoint_key_from_env(env),
            on_manifest=reports.committed if reports is not None else None,
        )
        sync.restore(claim=node_rank == 0)
        if reports is not None:
            reports.restored(sync.last_manifest)
            sync.start(_seconds(env, "GPUJOBS_DIRECTORY_SYNC_SECONDS", DEFAULT_SYNC_SECONDS))
        flags = StopFlags()
        watcher = _spot_watcher(config, flags)
        return cls(mode, folder, sync if node_rank == 0 else None, flags, watcher, reports)

    @property
    def env(self) -> dict[str, str]:
        return {"GPUJOBS_CHECKPOINT_DIR": str(self.folder)}

    def started(self) -> None:
        """The script is running: heartbeats from now on."""
        if self.reports is not None:
            self.reports.start()

    def spot_notice(self) -> str:
        """Why the instance is going away (the spot notice), or "" while it is not."""
        return self.flags.preempt_reason if self.flags is not None and self.flags.preempt else ""

    def finish(self, *, torchrun_code: int, stopped: bool) -> JobOutcome:
        """The last sync after the workers exited (retried with backoff), then the attempt's outcome."""
        if self.watcher is not None:
            self.watcher.stop()
        synced = True
        if self.sync is not None:
            try:
                self.sync.finish(sleep=self.final_sync_sleep)
            except Exception:
                log.exception(
                    "the last sync of %s failed: what the script saved since the last one is lost", self.folder
                )
                synced = False
        if self.reports is not None:
            self.reports.stop()
        return script_exit(torchrun_code=torchrun_code, stopped=stopped, synced=synced)


def _spot_watcher(config: TrainerConfig, flags: StopFlags) -> ImdsWatcher | None:
    """The trainer's IMDS watcher, started, unless GPUJOBS_IMDS is off."""
    if config.imds_mode == "off":
        return None
    client = ImdsClient(config.imds_endpoint)
    watcher = ImdsWatcher(client, flags, interval=config.imds_poll_seconds, required=config.imds_mode == "required")
    watcher.start()
    return watcher


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, not {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, not {raw!r}")
    return value
