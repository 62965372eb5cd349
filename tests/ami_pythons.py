"""The AMIs' own Pythons, for running the bootstrap as an instance would.

The bootstrap runs on whatever `python3` the AMI has: 3.9 on Amazon Linux 2023, 3.10 on the Ubuntu
22.04 DLAMI (docs/instance.md, "Supported AMIs and Pythons"). Tests that run the bundled bootstrap
as a process run it under those interpreters too, each in a virtual environment holding only what
the bootstrap needs there: boto3 (`ami-python-requirements.txt`), nothing of this repository and no
pytest. The interpreters come from pyenv (every developer machine and CI have 3.9 and 3.10 in
`~/.pyenv/versions`); the environments are made once and kept in `.venv-py39/` and `.venv-py310/`
at the repository root (rebuilt when the requirements change).

Where an interpreter is missing, its runs are skipped, except under CI (`CI` set), where that is
an error: the check that the bootstrap runs on 3.9 and 3.10 must not pass by not running.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = Path(__file__).with_name("ami-python-requirements.txt")
AMI_PYTHONS = {"3.9": "Amazon Linux 2023", "3.10": "Ubuntu 22.04 DLAMI"}
"""The oldest `python3` of each AMI the bootstrap supports: version -> AMI."""


class MissingPythonError(LookupError):
    """No interpreter of this version on this machine."""


def find_interpreter(version: str) -> Path:
    """The newest pyenv CPython `version`.N (else `pythonX.Y` on PATH); MissingPythonError if none."""
    roots = [os.environ.get("PYENV_ROOT", ""), str(Path.home() / ".pyenv")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        done = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
        roots.insert(0, done.stdout.strip())
    found: list[tuple[tuple[int, ...], Path]] = []
    for root in filter(None, roots):
        for candidate in glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")):
            patch = Path(candidate).parents[1].name.removeprefix(f"{version}.")
            if patch.isdigit():
                found.append(((int(patch),), Path(candidate)))
    if found:
        return max(found)[1]
    on_path = shutil.which(f"python{version}")
    if on_path:
        return Path(on_path)
    raise MissingPythonError(f"no Python {version} ({AMI_PYTHONS.get(version, '?')}'s python3): install it with pyenv")


def ami_python(version: str) -> Path:
    """The python of `.venv-pyXY` (made now if missing or stale): interpreter `version` with only boto3.

    Raises MissingPythonError when there is no such interpreter, CalledProcessError when the
    environment cannot be made (pip's output is in the error).
    """
    interpreter = find_interpreter(version)
    venv = ROOT / f".venv-py{version.replace('.', '')}"
    python = venv / "bin" / "python"
    stamp = venv / ".gpujobs-requirements"
    wanted = f"{interpreter}\n{hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()}\n"
    # pytest-xdist's workers all ask at once on a fresh clone: one makes the environment, the
    # others wait for it (without the lock one worker's rmtree ran under another's pip install)
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text() == wanted:
            return python
        shutil.rmtree(venv, ignore_errors=True)
        _run([str(interpreter), "-m", "venv", str(venv)])
        _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(REQUIREMENTS)])
        stamp.write_text(wanted)
        return python


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
