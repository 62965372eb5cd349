"""What `gpujobs submit` checks offline about `code:` and the image, before anything is uploaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpujobs_cli import code
from gpujobs_cli.code import CodePackError, entrypoint_warning, pack

LAUNCHER = ["python", "-m", "gpujobs_trainer.launch", "--"]


def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, entrypoint: list[str] | None) -> None:
    """`docker image inspect` answering with `entrypoint`, or failing like an image not present."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answer = f"echo '{json.dumps(entrypoint)}'" if entrypoint is not None else "echo 'No such image' >&2; exit 1"
    (bin_dir / "docker").write_text(f"#!/bin/sh\n{answer}\n")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_an_image_built_on_the_training_image_passes_the_entrypoint_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_docker(tmp_path, monkeypatch, entrypoint=LAUNCHER)
    assert entrypoint_warning("team/train:1", needs_launcher=True) is None


def test_an_image_with_another_entrypoint_is_warned_about_when_the_job_needs_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_docker(tmp_path, monkeypatch, entrypoint=["/bin/sh", "-c"])

    warning = entrypoint_warning("team/train:1", needs_launcher=True)

    assert warning is not None
    assert warning.startswith('image team/train:1\'s entrypoint is ["/bin/sh", "-c"]')
    assert entrypoint_warning("team/train:1", needs_launcher=False) is None  # checkpoint: none, no code


def test_nothing_is_said_about_an_image_docker_does_not_have(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_docker(tmp_path, monkeypatch, entrypoint=None)
    assert entrypoint_warning("team/train:1", needs_launcher=True) is None


def test_a_link_to_a_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "src" / "real").mkdir(parents=True)
    (tmp_path / "src" / "alias").symlink_to(tmp_path / "src" / "real")
    with pytest.raises(CodePackError, match="alias is a link to a folder"):
        pack(tmp_path / "src")


def test_a_link_to_a_file_inside_the_folder_is_packed_as_that_file(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.yaml").write_text("lr: 0.1\n")
    (tmp_path / "src" / "default.yaml").symlink_to(tmp_path / "src" / "config.yaml")
    assert pack(tmp_path / "src").files == 2


def test_a_folder_over_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code, "MAX_CODE_BYTES", 1024)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "weights.bin").write_bytes(bytes(range(256)) * 64)
    with pytest.raises(CodePackError, match="put data in a bucket"):
        pack(tmp_path / "src")


def test_submit_refuses_requirements_that_are_not_in_the_packed_code_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in `requirements:` (or a file .gpujobsignore leaves out) would fail only on the
    instances, after their launch: submit says so first, naming the field, and sends nothing."""
    from gpujobs_cli import commands
    from gpujobs_cli.main import main

    def no_aws(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("nothing may be uploaded or sent")

    monkeypatch.setattr(commands, "_discover", no_aws)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    (tmp_path / "src" / "requirements.txt").write_text("einops\n")
    (tmp_path / "src" / ".gpujobsignore").write_text("requirements.txt\n")
    spec = {
        "name": "acc",
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:latest",
        "command": ["python", "train.py"],
        "instance_types": ["g5.xlarge"],
        "code": "./src",
        "requirements": "requirements.txt",
    }
    (tmp_path / "job.json").write_text(json.dumps(spec))

    assert main(["submit", str(tmp_path / "job.json")]) == 1
    assert "requirements: 'requirements.txt' is not a file packed from code: ./src" in capsys.readouterr().err

    assert pack(tmp_path / "src").names == {"train.py"}
