"""`make unit` runs none of the moto, template, container or torch tests: their folder marks them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.call_ledger import LEDGER_DIR_ENV
from tests.folders import TESTS, markers_of

UNIT = "not integration and not training"  # the Makefile's `make unit`


@pytest.mark.parametrize(
    ("module", "markers"),
    [
        ("integration/test_sam_build.py", ("integration",)),
        ("training/test_busy_heartbeats.py", ("training",)),
        ("e2e/test_local_cloud_stories.py", ("integration", "training")),
        ("unit/test_spec.py", ()),
        ("service/test_thirty_days.py", ()),
    ],
)
def test_a_modules_folder_gives_its_markers(module: str, markers: tuple[str, ...]) -> None:
    assert (TESTS / module).exists()
    assert markers_of(TESTS / module) == markers


def test_make_unit_selects_nothing_from_the_integration_training_and_e2e_folders(tmp_path: Path) -> None:
    # tests/training/test_busy_heartbeats.py and tests/integration/test_sam_build.py carry no marker themselves
    modules = ["training/test_busy_heartbeats.py", "integration/test_sam_build.py"]
    assert not any(
        "mark.training" in (TESTS / m).read_text() or "mark.integration" in (TESTS / m).read_text() for m in modules
    )
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "--no-call-ledger-check",
            "-m",
            UNIT,
            *(str(TESTS / m) for m in modules),
        ],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        check=False,
        # its own ledger folder: the running suite's (inherited) is half written and not its to judge
        env={**os.environ, LEDGER_DIR_ENV: str(tmp_path)},
    )
    assert "deselected" in listed.stdout, listed.stdout + listed.stderr
    assert not [line for line in listed.stdout.splitlines() if "::" in line], listed.stdout
