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
  outside (SIGTERM or the spot notice) and its folder is safely in S3, 1 otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpujobs_trainer.config import TrainerConfig
from gpujobs_trainer.directory_sync import DirectorySync, local_folder, objects_for
from gpujobs_trainer.errors import CRASH_EXIT_CODE, PREEMPTED_EXIT_CODE, SUCCESS_EXIT_CODE, ConfigError
from gpujobs_trainer.interruption import ImdsClient, ImdsWatcher, StopFlags
from gpujobs_trainer.outcome import JobOutcome

log = logging.getLogger("gpujobs_trainer.launch")

GPUJOBS, DIRECTORY, NONE = "gpujobs", "directory", "none"
CHECKPOINT_MODES = (GPUJOBS, DIRECTORY, NONE)
"""The spec's `checkpoint` values, as GPUJOBS_CHECKPOINT_MODE carries them."""
DEFAULT_SYNC_SECONDS = 10.0


def checkpoint_mode(env: Mapping[str, str]) -> str:
    """GPUJOBS_CHECKPOINT_MODE (default gpujobs), or ConfigError naming the choices."""
    mode = env.get("GPUJOBS_CHECKPOINT_MODE", "").strip() or GPUJOBS
    if mode not in CHECKPOINT_MODES:
        raise ConfigError(f"GPUJOBS_CHECKPOINT_MODE must be one of {', '.join(CHECKPOINT_MODES)}, not {mode!r}")
    return mode


def script_exit(*, torchrun_code: int, stopped: bool, synced: bool) -> JobOutcome:
    """Pure: the launcher's exit code for a script that reports no outcome files of its own."""
    if not synced:
        return JobOutcome(CRASH_EXIT_CODE, "crashed")
    if torchrun_code == SUCCESS_EXIT_CODE:
        return JobOutcome(SUCCESS_EXIT_CODE, "succeeded")
    if stopped:
        return JobOutcome(PREEMPTED_EXIT_CODE, "preempted")
    return JobOutcome(CRASH_EXIT_CODE, "crashed")


def signals_caught(pid: int, proc_root: Path = Path("/proc")) -> int:
    """The bitmask of signals ``pid`` has a handler for (SigCgt in /proc/<pid>/status; 0 if gone)."""
    try:
        status = (proc_root / str(pid) / "status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16)
    return 0


def catches(pid: int, signum: int, proc_root: Path = Path("/proc")) -> bool:
    """Whether ``pid`` handles ``signum`` (sending it would not run the default action)."""
    return bool(signals_caught(pid, proc_root) >> (signum - 1) & 1)


@dataclass
class ScriptCheckpoints:
    """One attempt's checkpoint folder: restored and synced (``directory``) or just provided (``none``)."""

    mode: str
    folder: Path
    sync: DirectorySync | None = None
    flags: StopFlags | None = None
    watcher: ImdsWatcher | None = None

    @classmethod
    def open(cls, mode: str, env: Mapping[str, str], *, node_rank: int) -> ScriptCheckpoints:
        """The folder, restored for ``directory`` (CheckpointError when the copy is unusable) and
        synced from node 0, whose folder is the job's; every node watches for the spot notice."""
        folder = local_folder(env)
        if mode != DIRECTORY:
            return cls(mode, folder)
        config = TrainerConfig.from_env(env)
        interval = _seconds(env, "GPUJOBS_DIRECTORY_SYNC_SECONDS", DEFAULT_SYNC_SECONDS)
        sync = DirectorySync(folder, objects_for(config.checkpoint_uri))
        sync.restore()
        if node_rank == 0:
            sync.start(interval)
        flags = StopFlags()
        watcher = _spot_watcher(config, flags)
        return cls(mode, folder, sync if node_rank == 0 else None, flags, watcher)

    @property
    def env(self) -> dict[str, str]:
        return {"GPUJOBS_CHECKPOINT_DIR": str(self.folder)}

    def spot_notice(self) -> str:
        """Why the instance is going away (the spot notice), or "" while it is not."""
        return self.flags.preempt_reason if self.flags is not None and self.flags.preempt else ""

    def finish(self, *, torchrun_code: int, stopped: bool) -> JobOutcome:
        """The last sync after the workers exited, then the attempt's outcome."""
        if self.watcher is not None:
            self.watcher.stop()
        synced = True
        if self.sync is not None:
            try:
                self.sync.finish()
            except Exception:
                log.exception(
                    "the last sync of %s failed: what the script saved since the last one is lost", self.folder
                )
                synced = False
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
