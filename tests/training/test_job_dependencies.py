"""A job's `requirements:` and `setup:` (issue 22): what it needs beyond the image, made ready in the
container by the launcher, never by building an image.

No network: the requirements resolve from a wheel built in the test's folder (`pip --no-index
--find-links`, written into the requirements file itself, as a user may).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs_trainer import CONFIG_ERROR_EXIT_CODE
from gpujobs_trainer.dependencies import SetupFailedError, base_fingerprint, cache_key, prepare_venv, run_setup
from tests.training.wheels import build_wheel, offline_requirements

BUCKET = "gpujobs-checkpoints"
CACHE_URI = f"s3://{BUCKET}/jobs/j-0123456789abcdef/venvs"
IMPORTS = "import tinypkg, torch, gpujobs_trainer; print('tinypkg', tinypkg.VERSION, 'from', tinypkg.__file__)"


def launcher_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The launcher's environment on one node, none of this host's GPUJOBS_* leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOBS_", "PIP_", "VIRTUAL_ENV"))}
    env.update(
        GPUJOBS_NPROC_PER_NODE="1",
        GPUJOBS_CHECKPOINT_MODE="none",
        GPUJOBS_VENV_ROOT=str(tmp_path / "venvs"),
        TMPDIR=str(tmp_path),
        **extra,
    )
    return env


def launch(workdir: Path, env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpujobs_trainer.launch", "--", *command],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.fixture
def code(tmp_path: Path) -> Path:
    """The unpacked `code:` folder of a job whose requirements.txt lists `tinypkg` (a local wheel)."""
    folder = tmp_path / "code"
    folder.mkdir()
    build_wheel(tmp_path / "wheels", name="tinypkg", version="0.1")
    offline_requirements(folder / "requirements.txt", wheels=tmp_path / "wheels", packages=["tinypkg==0.1"])
    return folder


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def test_the_cache_key_is_the_requirements_content_on_top_of_the_image_environment() -> None:
    """Same file on the same image: the same venv. Another file, or an image with other packages
    or another Python, needs its own."""
    base = base_fingerprint()
    key = cache_key(b"tinypkg==0.1\n", base=base)

    assert key == cache_key(b"tinypkg==0.1\n", base=base)
    assert key != cache_key(b"tinypkg==0.2\n", base=base)
    assert key != cache_key(b"tinypkg==0.1\n", base="an image with other packages")
    assert len(key) == 64
    assert int(key, 16) >= 0


def test_the_workload_imports_a_package_its_requirements_install_into_a_venv_layered_on_the_image(
    tmp_path: Path, code: Path
) -> None:
    """Given requirements listing a package the image lacks, the command (through torchrun) imports
    it from the job's venv, and still sees the image's own packages (torch, the trainer)."""
    env = launcher_env(tmp_path, GPUJOBS_REQUIREMENTS="requirements.txt")

    result = launch(code, env, "python", "-c", IMPORTS)

    assert result.returncode == 0, result.stderr[-3000:]
    assert "tinypkg 0.1 from " + str(tmp_path / "venvs" / "gpujobs-venvs") in result.stdout
    # ... installed into the job's venv only, never into the image's (here: this test's) environment
    host = subprocess.run([sys.executable, "-c", "import tinypkg"], capture_output=True, check=False, env=env)
    assert host.returncode != 0


def test_a_replacement_node_restores_the_cached_venv_instead_of_installing_again(
    tmp_path: Path, code: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node one installs and caches the venv under the job's prefix; a replacement (a fresh disk)
    downloads it: pip never runs there, and the package imports from the restored venv."""
    first = prepare_venv(
        launcher_env(tmp_path / "one", GPUJOBS_REQUIREMENTS="requirements.txt", GPUJOBS_VENV_CACHE_URI=CACHE_URI),
        code,
        s3=s3,
    )
    assert first is not None
    cached = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert [k.rsplit("/", 1)[0] for k in cached] == ["jobs/j-0123456789abcdef/venvs"]

    ran: list[list[str]] = []

    def no_pip(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        ran.append(argv)
        assert "pip" not in argv, "the replacement installed again"
        return subprocess.run(argv, **kwargs)  # noqa: PLW1510 (check comes in kwargs)

    (tmp_path / "wheels" / "tinypkg-0.1-py3-none-any.whl").unlink()  # nothing left to install from
    env = launcher_env(tmp_path / "two", GPUJOBS_REQUIREMENTS="requirements.txt", GPUJOBS_VENV_CACHE_URI=CACHE_URI)
    second = prepare_venv(env, code, s3=s3, run=no_pip)

    assert second is not None
    assert second != first
    assert [argv[1:3] for argv in ran] == [["-m", "venv"]]  # made the venv, installed nothing
    imported = subprocess.run(
        [str(second / "bin" / "python"), "-c", IMPORTS], capture_output=True, text=True, check=False, env=env
    )
    assert imported.returncode == 0, imported.stderr
    assert f"from {second}" in imported.stdout


def test_setup_commands_run_in_order_in_the_container_and_the_first_failure_is_named(tmp_path: Path) -> None:
    """An argv command runs as is, a string through /bin/sh -c; the failing one is named with its
    exit code, and nothing after it runs."""
    commands = [["touch", "first"], ["/bin/sh", "-c", "echo made > second && exit 3"], ["touch", "third"]]

    with pytest.raises(SetupFailedError, match=r"setup\[1\] \(echo made > second && exit 3\) exited 3"):
        run_setup(commands, dict(os.environ), tmp_path)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "second"]


def test_a_failing_setup_ends_the_attempt_as_a_configuration_error_before_the_command(
    tmp_path: Path,
) -> None:
    """Through the launcher: the setup's output is the job's log, the last line names the command and
    its exit code (the bootstrap quotes it), exit 78, and the training command never starts."""
    setup = [["/bin/sh", "-c", "echo installing things; exit 4"]]
    env = launcher_env(tmp_path, GPUJOBS_SETUP=json.dumps(setup))

    result = launch(tmp_path, env, "python", "-c", "open('trained', 'w').close()")

    assert result.returncode == CONFIG_ERROR_EXIT_CODE
    assert "installing things" in result.stdout
    assert "setup[0] (echo installing things; exit 4) exited 4" in result.stderr.splitlines()[-1]
    assert not (tmp_path / "trained").exists()


def test_a_requirements_file_missing_from_the_code_is_a_configuration_error(tmp_path: Path) -> None:
    env = launcher_env(tmp_path, GPUJOBS_REQUIREMENTS="requirements/train.txt")

    result = launch(tmp_path, env, "python", "-c", "pass")

    assert result.returncode == CONFIG_ERROR_EXIT_CODE
    assert "requirements: 'requirements/train.txt' is not a file of the job's code" in result.stderr


def test_requirements_pip_cannot_install_end_the_attempt_naming_the_file_and_pips_exit_code(
    tmp_path: Path, code: Path
) -> None:
    """A package no index or wheel folder has: pip's own output says which; the last line says what failed."""
    offline_requirements(code / "requirements.txt", wheels=tmp_path / "wheels", packages=["tinypkg==9.9"])

    with pytest.raises(SetupFailedError, match=r"^requirements: pip install -r requirements.txt exited 1 "):
        prepare_venv(launcher_env(tmp_path, GPUJOBS_REQUIREMENTS="requirements.txt"), code)


def test_a_checkpoint_request_during_setup_does_not_kill_the_launcher(tmp_path: Path) -> None:
    """SIGUSR1 ("checkpoint now") may come while a long setup runs: there is nothing to save yet,
    and the launcher goes on to the command (a setup step sends it to the launcher itself)."""
    asks = "import os, signal; os.kill(os.getppid(), signal.SIGUSR1); print('asked')"
    env = launcher_env(tmp_path, GPUJOBS_SETUP=json.dumps([["python", "-c", asks]]))

    result = launch(tmp_path, env, "python", "-c", "open('trained', 'w').close()")

    assert result.returncode == 0, result.stderr[-2000:]
    assert "asked" in result.stdout
    assert (tmp_path / "trained").exists()
