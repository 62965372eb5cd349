"""A tiny wheel built in a test's folder: a package to install with no network (`pip --no-index`)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(folder: Path, *, name: str, version: str = "0.1", body: str = "") -> Path:
    """`<name>-<version>-py3-none-any.whl` in `folder`: one module `name` whose source is `body`."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": (body or f"VERSION = {version!r}\n").encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpujobs-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": f"{name}\n".encode(),
    }
    record = [_record_line(path, data) for path, data in files.items()] + [f"{info}/RECORD,,"]
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def offline_requirements(path: Path, *, wheels: Path, packages: list[str]) -> Path:
    """A requirements file that pip resolves from `wheels` only (its own options, no index)."""
    path.write_text("\n".join(["--no-index", f"--find-links {wheels}", *packages]) + "\n", encoding="utf-8")
    return path
