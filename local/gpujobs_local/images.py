"""The images the local cloud can run, read from their Dockerfiles: what `docker run` would set up.

A job names an image (`123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:latest`) and a
command that uses the image's paths (`python /opt/gpujobs/examples/digits/train.py`). On EC2 the
bootstrap runs that image; here no image is built, so a local instance plays the image from its
recipe instead: the Dockerfile's `COPY` lines (what lands where in the image's tree), `ENV`,
`WORKDIR`, `ENTRYPOINT` and `CMD`, read from the file rather than copied into code, so the two
cannot drift. `FROM` and `RUN` are not replayed: the image's Python is played by `image_python`,
which sees only what the `RUN pip install -r FILE` lines install (`ImageRecipe.pip_requirements`;
this host's environment has them at the image's pins, from `make setup`).

`MappedImage` lays the image's tree under one instance's root folder and translates the image's
absolute paths (every `COPY` destination, the `WORKDIR` and the absolute paths `ENV` sets, and
everything below them) in argv words, `--flag=PATH` words and `PATH:PATH` lists to that folder.
A program that builds such a path itself at run time still sees the host's filesystem: use paths
from argv or the environment, or relative to the script's own file.

`IMAGES` is the catalog: an image is known by its repository name (registry and tag aside), so the
examples' ECR name and the tests' `local/gpujobs-train:dev` both mean `training_image/Dockerfile`.
Anything else is an `ImageError` that says what the local cloud can run.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
TRAINING_IMAGE_REPOSITORY = "gpujobs-train"


class ImageError(Exception):
    """The local cloud cannot run this image (unknown, or a Dockerfile it cannot read)."""


@dataclass(frozen=True)
class Copy:
    """One `COPY source... destination`: host paths from the build context, an image path."""

    sources: tuple[Path, ...]
    destination: PurePosixPath
    into_folder: bool  # the destination ends with "/" (or several sources): sources land inside it


@dataclass(frozen=True)
class ImageRecipe:
    """What a Dockerfile's final stage says about the image's tree and its process."""

    copies: tuple[Copy, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    workdir: PurePosixPath = field(default_factory=lambda: PurePosixPath("/"))
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    pip_requirements: tuple[Path, ...] = ()
    """The build context's requirements files that `RUN pip install -r FILE` installs (`image_python`)."""

    def image_paths(self) -> tuple[PurePosixPath, ...]:
        """The image's own paths: below these, a path means the image's tree, not the host's."""
        paths = {copy.destination for copy in self.copies} | {self.workdir}
        for value in self.env.values():
            paths.update(PurePosixPath(part) for part in value.split(os.pathsep) if part.startswith("/"))
        return tuple(sorted(p for p in paths if p != PurePosixPath("/")))


def read_dockerfile(dockerfile: Path, *, context: Path) -> ImageRecipe:
    """The recipe of `dockerfile`'s last stage; `COPY` sources are resolved against `context`."""
    copies: list[Copy] = []
    env: dict[str, str] = {}
    workdir = PurePosixPath("/")
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    requirements: list[Path] = []
    for keyword, rest in _instructions(dockerfile.read_text(encoding="utf-8")):
        if "$" in rest and keyword in {"ENV", "COPY", "ADD", "WORKDIR"}:
            raise ImageError(f"{dockerfile}: {keyword} {rest!r} uses a variable; the local cloud does not expand them")
        if keyword == "FROM":  # a new stage: only the last one is the image
            copies, env, workdir, entrypoint, cmd, requirements = [], {}, PurePosixPath("/"), (), (), []
        elif keyword == "ENV":
            env.update(_env_pairs(rest))
        elif keyword in {"COPY", "ADD"}:
            copies.append(_copy(keyword, rest, context=context, workdir=workdir, where=dockerfile))
        elif keyword == "WORKDIR":
            workdir = workdir / rest.strip()
        elif keyword == "ENTRYPOINT":  # a base image's CMD would be dropped; this stage's is kept
            entrypoint = _exec_form(rest)
        elif keyword == "CMD":
            cmd = _exec_form(rest)
        elif keyword == "RUN":
            requirements += [_copied_from(copies, workdir / path) for path in _pip_requirement_files(rest)]
    return ImageRecipe(
        copies=tuple(copies),
        env=env,
        workdir=workdir,
        entrypoint=entrypoint,
        cmd=cmd,
        pip_requirements=tuple(requirements),
    )


def _pip_requirement_files(run: str) -> list[str]:
    """The files `pip install -r FILE` (or `--requirement FILE`) reads in one RUN line."""
    words = shlex.split(run.replace("&&", " && "))
    if "pip" not in words:
        return []
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word in ("-r", "--requirement")]


def _copied_from(copies: list[Copy], image_path: PurePosixPath) -> Path:
    """The build context's file that a COPY put at `image_path`; ImageError when none did."""
    for copy in reversed(copies):  # the last COPY to a path wins, as in the image
        for source in copy.sources:
            landed = copy.destination / source.name if copy.into_folder else copy.destination
            if landed == image_path and source.is_file():
                return source
    raise ImageError(f"RUN pip install -r {image_path}: no COPY from the build context put a file there")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comment lines dropped, `\\` continuations joined."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, rest = (pending + stripped).partition(" ")
        found.append((keyword.upper(), rest.strip()))
        pending = ""
    return found


def _env_pairs(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # the legacy form: ENV NAME the rest of the line
        name, _, value = rest.partition(" ")
        return {name: value.strip()}
    return dict(word.split("=", 1) for word in words)


def _copy(keyword: str, rest: str, *, context: Path, workdir: PurePosixPath, where: Path) -> Copy:
    words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    flags = [w for w in words if w.startswith("--")]
    paths = [w for w in words if not w.startswith("--")]
    if any(f.startswith("--from") for f in flags) or len(paths) < 2:
        raise ImageError(f"{where}: {keyword} {rest!r}: the local cloud copies only from the build context")
    if keyword == "ADD" and any("://" in p or p.endswith((".tar", ".gz", ".tgz", ".xz", ".bz2")) for p in paths):
        raise ImageError(f"{where}: ADD {rest!r}: the local cloud does not fetch URLs or unpack archives")
    *sources, destination = paths
    resolved = tuple((context / s).resolve() for s in sources)
    outside = [str(s) for s in resolved if not s.is_relative_to(context.resolve()) or not s.exists()]
    if outside:
        raise ImageError(f"{where}: {keyword} sources not in the build context {context}: {outside}")
    return Copy(
        sources=resolved,
        destination=workdir / destination,
        into_folder=destination.endswith("/") or len(sources) > 1,
    )


def _exec_form(rest: str) -> tuple[str, ...]:
    """ENTRYPOINT/CMD as argv: the JSON exec form, or the shell form run by /bin/sh -c."""
    if rest.startswith("["):
        words = json.loads(rest)
        if isinstance(words, list) and all(isinstance(w, str) for w in words):
            return tuple(words)
    return ("/bin/sh", "-c", rest)


@dataclass(frozen=True)
class MappedImage:
    """An image's tree laid under `root` (one instance's filesystem), and its paths translated to it."""

    recipe: ImageRecipe
    root: Path

    def lay_out(self) -> None:
        """Copy what `COPY` puts in the image under `root`, and create the `WORKDIR`; idempotent."""
        for copy in self.recipe.copies:
            target = self.host_path(copy.destination)
            for source in copy.sources:
                into = target / source.name if copy.into_folder and source.is_file() else target
                if source.is_dir():
                    shutil.copytree(source, into, symlinks=True, dirs_exist_ok=True)
                else:
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, into)
        self.host_path(self.recipe.workdir).mkdir(parents=True, exist_ok=True)

    def host_path(self, image_path: PurePosixPath) -> Path:
        return self.root / image_path.relative_to("/")

    def translate(self, word: str) -> str:
        """An image path (or `--flag=PATH`, or a `:`-separated list of them) as the host sees it."""
        flag, equals, value = word.partition("=")
        if equals and flag.startswith("-"):
            return f"{flag}={self.translate(value)}"
        return os.pathsep.join(self._one(part) for part in word.split(os.pathsep))

    def _one(self, part: str) -> str:
        if not part.startswith("/"):
            return part
        path = PurePosixPath(part)
        if any(path == p or path.is_relative_to(p) for p in self.recipe.image_paths()):
            return str(self.host_path(path))
        return part


def repository_name(image: str) -> str:
    """`registry/path/name:tag@digest` -> `name`."""
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


@dataclass(frozen=True)
class ImageCatalog:
    """The images the local cloud can run: repository name -> (Dockerfile, build context)."""

    dockerfiles: dict[str, tuple[Path, Path]]

    def recipe(self, image: str) -> ImageRecipe:
        found = self.dockerfiles.get(repository_name(image))
        if found is None:
            known = ", ".join(f"*/{name}:*" for name in sorted(self.dockerfiles))
            raise ImageError(
                f"the local cloud cannot run image {image!r}: it runs only images built from this repository's "
                f"Dockerfiles ({known}); run other images on AWS"
            )
        dockerfile, context = found
        return read_dockerfile(dockerfile, context=context)


IMAGES = ImageCatalog(
    dockerfiles={TRAINING_IMAGE_REPOSITORY: (ROOT / "training_image" / "Dockerfile", ROOT / "training_image")}
)
