"""The image's Python on a local instance: the packages its Dockerfile installs, never the host's others.

On EC2 the training image's `python` holds what its Dockerfile's `RUN pip install -r FILE` put
there, and nothing else: a job that imports a package it did not list in `requirements:` fails
there. A local instance has no image, so it plays that Python: a venv made from this host's base
interpreter (without the host's site-packages) whose one `.pth` adds a folder of links to exactly
these distributions of the host's environment: the ones those requirements files name, what they
require in turn (their `Requires-Dist`, extras aside), and pip, setuptools and wheel, which the
python base image carries. So `accelerate`, installed here by `make setup` for the docs' recipes,
is missing in a local job as it is on AWS unless the job's `requirements:` installs it.

The links are made per top-level name in a distribution's files; a namespace folder shared with an
unlisted distribution shows that one's modules too (imprecise, never hiding a listed one). The venv
lives in the instance's own filesystem (`ROOT_FOLDER` under its root), built once per instance.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT_FOLDER = ".image-python"
BASE_PACKAGES = frozenset({"pip", "setuptools", "wheel"})
"""What the python base image carries besides the standard library."""
_READY = "gpujobs-image-ready"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503's normalized name: `Scikit_Learn` and `scikit-learn` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(files: Iterable[Path]) -> set[str]:
    """The distributions requirements files name (options, comments and blank lines aside)."""
    names = set()
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            found = _NAME.match(line.split("#", 1)[0])
            if found and not line.lstrip().startswith("-"):
                names.add(canonical(found.group(1)))
    return names


def with_dependencies(names: set[str]) -> set[str]:
    """`names` and every distribution of this environment they require, transitively."""
    installed = {canonical(d.metadata["Name"]): d for d in importlib.metadata.distributions() if d.metadata["Name"]}
    wanted, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in wanted or name not in installed:
            continue
        wanted.add(name)
        for requirement in installed[name].requires or []:
            if "extra ==" not in requirement.replace('"', " ").replace("'", " "):
                found = _NAME.match(requirement)
                if found:
                    todo.append(canonical(found.group(1)))
    return wanted


def link_distributions(view: Path, names: set[str]) -> None:
    """A folder of links to the files (top-level names) of the distributions `names`."""
    view.mkdir(parents=True, exist_ok=True)
    for dist in importlib.metadata.distributions():
        if canonical(dist.metadata["Name"] or "") not in names:
            continue
        home = Path(str(dist.locate_file("")))
        tops = {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "__pycache__")}
        for top in sorted(tops):
            source, link = home / top, view / top
            if source.exists() and not top.endswith(".pth") and not link.exists():
                link.symlink_to(source)


def image_python(root: Path, requirements: Iterable[Path]) -> Path:
    """The image's Python for the instance whose filesystem is `root`: its venv folder (`bin/python`)."""
    venv = root / ROOT_FOLDER
    if (venv / _READY).exists():
        return venv
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True)
    view = venv / "image-packages"
    link_distributions(view, with_dependencies(requirement_names(requirements) | BASE_PACKAGES))
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "_gpujobs_image.pth").write_text(f"{view}\n", encoding="utf-8")
    (venv / _READY).touch()
    return venv
