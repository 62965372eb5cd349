"""TensorBoard event files reach S3 while the workload trains, not only when it ends: the launcher asks
the bootstrap for an upload when `$GPUJOBS_TB_DIR` changed, at most every period (an injected clock)."""

from __future__ import annotations

import os
from pathlib import Path

from gpujobs_trainer.outputs import OUTPUT_UPLOAD_REQUEST_FILE, TensorboardUploads


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _uploads(tmp_path: Path, clock: Clock, *, tb: Path | None = None) -> tuple[TensorboardUploads, Path, Path]:
    outputs = tmp_path / "outputs"
    folder = tb or outputs / "tensorboard"
    folder.mkdir(parents=True)
    env = {"GPUJOBS_OUTPUT_DIR": str(outputs), "GPUJOBS_TB_DIR": str(folder)}
    return TensorboardUploads(env, every=120, clock=clock), outputs, folder


def test_a_changed_tensorboard_folder_is_uploaded_once_a_period_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    clock = Clock()
    uploads, outputs, folder = _uploads(tmp_path, clock)
    request = outputs / OUTPUT_UPLOAD_REQUEST_FILE
    events = folder / "events.out.tfevents.1.host"
    events.write_bytes(b"scalars")

    clock.now += 60
    assert not uploads.tick()  # within the period: not even looked at
    clock.now += 60
    assert uploads.tick()
    assert request.exists()  # the bootstrap's request file: it uploads the changed files

    request.unlink()  # the bootstrap took it
    clock.now += 120
    assert not uploads.tick()  # nothing new
    assert not request.exists()

    later = events.stat().st_mtime + 10
    os.utime(events, (later, later))  # TensorBoard appended to its file
    clock.now += 120
    assert uploads.tick()
    assert request.exists()


def test_nothing_is_asked_outside_the_bootstrap_or_for_a_folder_outside_the_outputs(tmp_path: Path) -> None:
    clock = Clock()
    elsewhere, _, folder = _uploads(tmp_path, clock, tb=tmp_path / "elsewhere")
    (folder / "events.out.tfevents.1.host").write_bytes(b"scalars")
    plain = TensorboardUploads({"GPUJOBS_TB_DIR": str(folder)}, every=120, clock=clock)

    clock.now += 500

    assert not elsewhere.tick()
    assert not plain.tick()
