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


def tensorboard_env(env: dict[str, str]) -> dict[str, str]:
    """``$GPUJOBS_TB_DIR`` for the workload, the folder created (a value the job set itself is kept)."""
    folder = Path(env.get(TB_DIR_ENV) or Path(env.get(OUTPUT_DIR_ENV) or DEFAULT_OUTPUT_DIR) / TB_SUBDIR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # the workload may still create it, or write no event files at all
        logging.getLogger("gpujobs_trainer").warning("cannot create $%s %s: %s", TB_DIR_ENV, folder, exc)
    return {TB_DIR_ENV: str(folder)}


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
