"""The spec's `requirements:` and `setup:`: what a job needs beyond its image, made ready in the container.

`requirements:` names a pip requirements file inside the unpacked `code:`. It is installed into a
venv layered on the image's environment, so the image's packages (torch, the trainer) stay
visible and the file adds to them or overrides them: `python -m venv --system-site-packages
--without-pip` (the image's own pip installs into it). Where the launcher itself runs in a venv
(the local cloud's image, `gpujobs_local.image_python`), a venv made from it would layer on the
base interpreter instead, so there the new venv gets no system site-packages but a `.pth` that adds
the launcher's own site folders: exactly what the launcher sees, nothing of the host's besides. The command, its torchrun and `setup:` run
with that venv first on PATH (`VIRTUAL_ENV` set, as `activate` does).

A built venv is cached in S3 under the job's own prefix (`GPUJOBS_VENV_CACHE_URI`, the job role may
read and write only there), keyed by `cache_key`: the requirements file's bytes, the Python version
and platform, and every distribution the image's environment holds (a new image with other
packages gets a new key). A replacement node, or the next attempt, downloads and unpacks the venv
instead of installing again. The cache is the job's alone: a team-wide cache would let one job
plant code in another's venv. What is cached is the venv's site-packages and its `bin/` scripts;
a restored venv is created fresh at the same path, then filled, and the scripts' `#!` lines are
pointed at its python. A cached venv that cannot be read or unpacked is installed afresh; a failed
upload only costs the next node an install.

`setup:` commands run after that, in order, on every node and every attempt, in the working
directory with the job's environment; their output is the job's log. The first one that fails ends
the attempt as a configuration error (exit 78) naming the command and its exit code, as does a pip
install that fails: the same configuration fails the same way on another attempt.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from gpujobs_trainer.errors import ConfigError

log = logging.getLogger("gpujobs_trainer.dependencies")

REQUIREMENTS_ENV = "GPUJOBS_REQUIREMENTS"
VENV_CACHE_ENV = "GPUJOBS_VENV_CACHE_URI"
SETUP_ENV = "GPUJOBS_SETUP"
VENV_ROOT_ENV = "GPUJOBS_VENV_ROOT"
"""Where venvs are built (default: the temporary folder); the same path on every node of a job."""
MAX_REQUIREMENTS_BYTES = 256 * 1024
CACHE_FORMAT = "gpujobs-venv-1"
"""Part of every cache key: a change of what a cached archive holds changes every key."""
PREFIX_FILE = "gpujobs-venv-prefix"
"""In a cached archive: the venv's path where it was built, whose `#!` lines a restore rewrites."""
LAYER_PTH = "_gpujobs_image_layer.pth"

Runner = Callable[..., "subprocess.CompletedProcess[bytes]"]


class SetupFailedError(ConfigError):
    """A `setup:` command, or the install of `requirements:`, failed: the configuration is wrong."""


def base_fingerprint() -> str:
    """What the venv is layered on: this Python's version and platform and every distribution the
    image's environment holds, name and version (the image's content as far as a venv can tell)."""
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    parts = [sys.version, platform.machine(), sys.platform, sysconfig.get_platform(), *dists]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def cache_key(requirements: bytes, *, base: str) -> str:
    """Pure: the cache key of the venv that `requirements` installs on top of the `base` environment."""
    return hashlib.sha256(b"\n".join([CACHE_FORMAT.encode(), base.encode(), requirements])).hexdigest()


def read_requirements(workdir: Path, relative: str) -> Path:
    """The requirements file inside `workdir` (the unpacked code), or ConfigError naming it."""
    path = (workdir / relative).resolve()
    if not path.is_relative_to(workdir.resolve()):
        raise ConfigError(f"requirements: {relative!r} leads outside the code folder")
    if not path.is_file():
        raise ConfigError(f"requirements: {relative!r} is not a file of the job's code")
    if path.stat().st_size > MAX_REQUIREMENTS_BYTES:
        raise ConfigError(f"requirements: {relative!r} is larger than {MAX_REQUIREMENTS_BYTES} bytes")
    return path


def layered_sites() -> list[str]:
    """The launcher's own site folders when it runs in a venv (which `--system-site-packages` would
    not see from a venv made from it); none when it runs on the image's system Python."""
    if sys.prefix == sys.base_prefix:
        return []
    return [p for p in sysconfig.get_paths().values() if p.endswith("site-packages") and os.path.isdir(p)]


def create_venv(target: Path, *, run: Runner = subprocess.run) -> None:
    """An empty venv at `target` layered on this environment (its packages visible, its own first)."""
    sites = layered_sites()
    layer = [] if sites else ["--system-site-packages"]  # a venv's own folders, else the system Python's
    run([sys.executable, "-m", "venv", *layer, "--without-pip", str(target)], check=True)
    if sites:
        lines = "".join(f"import site; site.addsitedir({s!r})\n" for s in sites)
        (site_packages(target) / LAYER_PTH).write_text(lines, encoding="utf-8")


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise ConfigError(f"{venv} is not a venv: no lib/python*/site-packages")
    return found[0]


def pip_install(venv: Path, requirements: Path, env: Mapping[str, str], *, run: Runner = subprocess.run) -> None:
    """The image's pip, run by the venv's python, installs into the venv; SetupFailedError when it
    fails. It runs in the working directory, so relative paths in the file are the code's."""
    argv = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-input", "-r", str(requirements)]
    shown = env.get(REQUIREMENTS_ENV, requirements.name)
    log.info("installing %s into %s", shown, venv)
    result = run(argv, check=False, env={**activated(env, venv), "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if result.returncode != 0:
        raise SetupFailedError(f"requirements: pip install -r {shown} exited {result.returncode} (its output is above)")


def pack(venv: Path, archive: Path) -> None:
    """The venv's installed packages and scripts (not its links to the interpreter) as a .tar.gz."""
    prefix_file = archive.with_name(PREFIX_FILE)
    prefix_file.write_text(str(venv), encoding="utf-8")
    sites = site_packages(venv)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(prefix_file, arcname=PREFIX_FILE)
        tar.add(sites, arcname="site-packages", filter=lambda m: None if m.name.endswith(LAYER_PTH) else m)
        for script in sorted((venv / "bin").iterdir()):
            if script.is_file() and not script.is_symlink():
                tar.add(script, arcname=f"bin/{script.name}")


def unpack(archive: Path, venv: Path) -> None:
    """Fill a fresh venv from `pack`'s archive; `#!` lines that named the old path name this one.
    tarfile's `data` filter refuses absolute paths, `..` and links leading out of the venv."""
    with tempfile.TemporaryDirectory(prefix="gpujobs-venv-unpack-") as folder:
        scratch = Path(folder)
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(scratch, filter="data")
        old = (scratch / PREFIX_FILE).read_text(encoding="utf-8").encode()
        sites = site_packages(venv)
        for entry in sorted((scratch / "site-packages").iterdir()):
            shutil.move(entry, sites / entry.name)
        scripts = scratch / "bin"
        for script in sorted(scripts.iterdir()) if scripts.is_dir() else []:
            target = venv / "bin" / script.name
            if target.exists():
                continue  # the fresh venv's own (python, activate): already right for this path
            first, newline, rest = script.read_bytes().partition(b"\n")
            if first.startswith(b"#!") and old in first:
                script.write_bytes(first.replace(old, str(venv).encode()) + newline + rest)
            shutil.move(script, target)


class VenvCache:
    """Cached venvs under `uri` (s3://bucket/jobs/<job>/venvs), one `<key>.tar.gz` each."""

    def __init__(self, uri: str, *, s3: Any = None) -> None:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ConfigError(f"{VENV_CACHE_ENV} {uri!r} is not s3://bucket/prefix")
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        self._s3 = s3

    def _client(self) -> Any:
        if self._s3 is None:
            from gpujobs_trainer.code_archive import s3_client

            self._s3 = s3_client()
        return self._s3

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}.tar.gz" if self.prefix else f"{name}.tar.gz"

    def get(self, name: str, into: Path) -> bool:
        """Download the archive for `name` to `into`; False when there is none (or S3 failed)."""
        try:
            self._client().download_file(self.bucket, self.key(name), str(into))
        except Exception as exc:  # a miss (404) or S3 failing: either way, install instead
            log.info("no cached venv %s (%s): installing", name[:16], type(exc).__name__)
            return False
        return True

    def put(self, name: str, archive: Path) -> None:
        try:
            self._client().upload_file(str(archive), self.bucket, self.key(name))
        except Exception as exc:  # only costs the next node an install
            log.warning("could not cache the venv %s: %s", name[:16], exc)


READY_FILE = "gpujobs-venv-ready"
"""Written into a venv once it is complete: a venv without it (an install cut short) is rebuilt."""


def prepare_venv(env: Mapping[str, str], workdir: Path, *, s3: Any = None, run: Runner = subprocess.run) -> Path | None:
    """The venv of the job's `requirements:` (GPUJOBS_REQUIREMENTS), restored from the cache or
    installed (then cached); None when the job names no requirements."""
    relative = env.get(REQUIREMENTS_ENV, "").strip()
    if not relative:
        return None
    requirements = read_requirements(workdir, relative)
    key = cache_key(requirements.read_bytes(), base=base_fingerprint())
    venv = Path(env.get(VENV_ROOT_ENV, "").strip() or tempfile.gettempdir()) / "gpujobs-venvs" / key[:32]
    if (venv / READY_FILE).exists():  # this node built it already (a gang regrouped around a replacement)
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    uri = env.get(VENV_CACHE_ENV, "").strip()
    cache = VenvCache(uri, s3=s3) if uri else None
    create_venv(venv, run=run)
    with tempfile.TemporaryDirectory(prefix="gpujobs-venv-") as folder:
        archive = Path(folder) / "venv.tar.gz"
        if cache is not None and cache.get(key, archive):
            try:
                unpack(archive, venv)
                log.info("restored the cached venv of %s (key %s): nothing installed", relative, key[:16])
                return _ready(venv)
            except (tarfile.TarError, OSError, ValueError) as exc:  # unreadable: install instead
                log.warning("cached venv %s unusable (%s): installing", key[:16], exc)
                shutil.rmtree(venv, ignore_errors=True)
                create_venv(venv, run=run)
        pip_install(venv, requirements, env, run=run)
        if cache is not None:
            pack(venv, archive)
            cache.put(key, archive)
    return _ready(venv)


def _ready(venv: Path) -> Path:
    (venv / READY_FILE).touch()
    return venv


def activated(env: Mapping[str, str], venv: Path | None) -> dict[str, str]:
    """`env` with `venv` active as `bin/activate` makes it: first on PATH, VIRTUAL_ENV set."""
    if venv is None:
        return dict(env)
    active = {k: v for k, v in env.items() if k != "PYTHONHOME"}
    active["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", os.defpath)])
    active["VIRTUAL_ENV"] = str(venv)
    return active


def setup_commands(env: Mapping[str, str]) -> list[list[str]]:
    """GPUJOBS_SETUP (a JSON list of argv lists), or ConfigError when it is anything else."""
    raw = env.get(SETUP_ENV, "").strip()
    if not raw:
        return []
    try:
        commands = json.loads(raw)
    except ValueError:
        commands = None
    if not isinstance(commands, list) or not all(
        isinstance(c, list) and c and all(isinstance(a, str) for a in c) for c in commands
    ):
        raise ConfigError(f"{SETUP_ENV} must be a JSON list of argv lists")
    return commands


def run_setup(
    commands: Sequence[Sequence[str]], env: Mapping[str, str], workdir: Path, *, run: Runner = subprocess.run
) -> None:
    """Each command in order, its output the job's; SetupFailedError names the first that fails."""
    for index, argv in enumerate(commands):
        shown = argv[2] if list(argv[:2]) == ["/bin/sh", "-c"] and len(argv) == 3 else shlex.join(argv)
        log.info("setup[%d]: %s", index, shown)
        try:
            code = run(list(argv), cwd=workdir, env=dict(env), check=False).returncode
        except OSError as exc:
            raise SetupFailedError(f"setup[{index}] ({shown[:200]}) could not start: {exc.strerror}") from exc
        if code != 0:
            raise SetupFailedError(f"setup[{index}] ({shown[:200]}) exited {code}; the job's command was not started")


def make_ready(
    env: Mapping[str, str], workdir: Path, *, setup_env: Mapping[str, str] | None = None
) -> tuple[dict[str, str], str]:
    """Before the command: its requirements installed (or restored) and its setup run. Returns the
    command's environment (the venv active) and the python that runs torchrun; `setup_env` adds to
    what the setup commands see (a script's own checkpoint folder)."""
    venv = prepare_venv(env, workdir)
    active = activated(env, venv)
    run_setup(setup_commands(env), {**active, **(setup_env or {})}, workdir)
    return active, str(venv / "bin" / "python") if venv is not None else sys.executable
