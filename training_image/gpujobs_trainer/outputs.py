"""The job's output folder as the trainer sees it: the names it shares with the bootstrap.

What the workload writes to ``$GPUJOBS_OUTPUT_DIR`` is uploaded by the instance bootstrap to
``s3://<bucket>/outputs/<job-id>/`` when the job ends, and whenever the workload creates the request
file (``request_upload``). This module is the trainer's copy of those names (another artifact
cannot import the layer's contract); tests/unit/test_contract.py compares it with the contract.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

OUTPUT_DIR_ENV = "GPUJOBS_OUTPUT_DIR"
"""The output folder the bootstrap gives the workload; outside gpujobs, ``DEFAULT_OUTPUT_DIR``."""
OUTPUT_UNSENT_PREFIX = ".gpujobs-"
"""Names the bootstrap never uploads: the request below, and files being written (renamed when done)."""
OUTPUT_UPLOAD_REQUEST_FILE = OUTPUT_UNSENT_PREFIX + "upload-now"
"""Created to ask for an upload now; the bootstrap takes it within a second."""
OUTPUT_UPLOAD_TAKEN_FILE = OUTPUT_UNSENT_PREFIX + "uploading"
"""The request while the bootstrap uploads; removed once the upload is done."""
DEFAULT_OUTPUT_DIR = "outputs"
"""Relative to the working directory: where outputs go under a plain ``torchrun`` (nothing uploads them)."""
TB_DIR_ENV = "GPUJOBS_TB_DIR"
"""Where the workload writes TensorBoard event files: ``tensorboard/`` in the output folder, so they are
uploaded with the outputs (``outputs/<team>/<job-id>/tensorboard/``) and ``gpujobs tensorboard`` serves them."""
TB_SUBDIR = "tensorboard"
TB_UPLOAD_SECONDS = 120.0
"""While the workload runs, its TensorBoard folder is uploaded this often when it changed (`TensorboardUploads`)."""


def tensorboard_env(env: dict[str, str]) -> dict[str, str]:
    """``$GPUJOBS_TB_DIR`` for the workload, the folder created (a value the job set itself is kept)."""
    folder = Path(env.get(TB_DIR_ENV) or Path(env.get(OUTPUT_DIR_ENV) or DEFAULT_OUTPUT_DIR) / TB_SUBDIR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # the workload may still create it, or write no event files at all
        logging.getLogger("gpujobs_trainer").warning("cannot create $%s %s: %s", TB_DIR_ENV, folder, exc)
    return {TB_DIR_ENV: str(folder)}


class TensorboardUploads:
    """The launcher's side of a live TensorBoard: while the workload runs, every ``every`` seconds, if a
    file under ``$GPUJOBS_TB_DIR`` changed since the last look, it asks the bootstrap to upload the
    output folder (which sends changed files only), so ``gpujobs tensorboard`` shows a run as it trains,
    not only once it ends. Only under the bootstrap (``$GPUJOBS_OUTPUT_DIR`` set) and for a folder inside
    the output folder; ``tick`` is called from the launcher's wait loop, never from a thread of its own."""

    def __init__(
        self, env: dict[str, str], *, every: float = TB_UPLOAD_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        output_dir, folder = env.get(OUTPUT_DIR_ENV), env.get(TB_DIR_ENV)
        self.output_dir = Path(output_dir) if output_dir else None
        inside = bool(output_dir and folder) and Path(str(folder)).resolve().is_relative_to(
            Path(str(output_dir)).resolve()
        )
        self.folder = Path(str(folder)) if inside else None
        self.every, self.clock = every, clock
        self._looked, self._newest = clock(), 0.0

    def tick(self) -> bool:
        """Look if a period has passed; True when an upload was asked for."""
        if self.folder is None or self.output_dir is None or self.clock() - self._looked < self.every:
            return False
        self._looked = self.clock()
        newest = max((entry.stat().st_mtime for entry in self.folder.rglob("*") if entry.is_file()), default=0.0)
        if newest <= self._newest:
            return False
        self._newest = newest
        request_upload(self.output_dir)
        return True


def request_upload(folder: Path) -> None:
    """Ask the bootstrap to upload ``folder`` now; harmless where nothing uploads it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OUTPUT_UPLOAD_REQUEST_FILE).touch()


def upload_and_wait(folder: Path, *, timeout: float, poll: float = 0.25) -> bool:
    """Ask for an upload of ``folder`` and wait until the bootstrap has done it (True) or ``timeout`` passes.

    Only where a bootstrap serves the folder: elsewhere nothing takes the request and this waits in vain."""
    request_upload(folder)
    deadline = time.monotonic() + timeout
    while (folder / OUTPUT_UPLOAD_REQUEST_FILE).exists() or (folder / OUTPUT_UPLOAD_TAKEN_FILE).exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def write_then_rename(path: Path) -> Path:
    """The temporary name to write ``path`` under before ``os.replace`` gives it its own: never uploaded half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f"{OUTPUT_UNSENT_PREFIX}{os.getpid()}-{path.name}")
