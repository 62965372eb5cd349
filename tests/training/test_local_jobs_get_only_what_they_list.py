"""The local cloud installs what a job's spec says, never the host's packages (issue 22): a job that
imports a package its requirements do not list fails locally as it would on AWS.

The training image as a local instance runs it (`gpujobs_local.container`: the image's tree, its
ENTRYPOINT, the launcher, torchrun), with the image's Python: the packages its Dockerfile installs.
`accelerate` is in this host's environment (`make setup` installs it for the docs' recipes) and
not in the training image.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpujobs_local.image_python import ROOT_FOLDER
from tests.training.wheels import build_wheel, offline_requirements

IMAGE = "local/gpujobs-train:dev"


def run_in_the_image(tmp_path: Path, *command: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`docker run IMAGE COMMAND` as a local instance does it, with the job's environment."""
    given = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOBS_", "PIP_"))}
    given.update(GPUJOBS_NPROC_PER_NODE="1", GPUJOBS_CHECKPOINT_MODE="none", TMPDIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, "-m", "gpujobs_local.container", "--root", str(tmp_path / "rootfs"), IMAGE, *command],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=given,
    )


def test_a_package_of_the_host_that_the_image_lacks_is_missing_in_a_local_job(tmp_path: Path) -> None:
    on_host = subprocess.run([sys.executable, "-c", "import accelerate"], capture_output=True, check=False)
    assert on_host.returncode == 0, "make setup installs accelerate on the host (the frameworks extra)"

    result = run_in_the_image(
        tmp_path, "python", "-c", "import torch, numpy, boto3, gpujobs_trainer; import accelerate"
    )

    assert result.returncode != 0
    assert "ModuleNotFoundError: No module named 'accelerate'" in result.stderr
    assert "No module named 'torch'" not in result.stderr  # the image's own packages are there


def test_a_local_job_imports_what_its_requirements_install(tmp_path: Path) -> None:
    """The same job, its code carrying requirements that list the package: it installs and imports."""
    workdir = tmp_path / "rootfs" / "home" / "trainer"  # the image's WORKDIR, where `code:` is unpacked
    workdir.mkdir(parents=True)
    build_wheel(tmp_path / "wheels", name="tinypkg", version="0.2")
    offline_requirements(workdir / "requirements.txt", wheels=tmp_path / "wheels", packages=["tinypkg==0.2"])

    result = run_in_the_image(
        tmp_path,
        "python",
        "-c",
        "import sys, tinypkg, torch; print('tinypkg', tinypkg.VERSION, sys.prefix)",
        GPUJOBS_REQUIREMENTS="requirements.txt",
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert "tinypkg 0.2 " in result.stdout
    assert (tmp_path / "rootfs" / ROOT_FOLDER / "bin" / "python").exists()  # the image's Python ran the launcher
