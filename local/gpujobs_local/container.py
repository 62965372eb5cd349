"""`python -m gpujobs_local.container --root DIR IMAGE COMMAND...`: `docker run IMAGE COMMAND...` for a local instance.

The bootstrap's process runtime starts this as the workload (`--engine`), and this process becomes
the image's entrypoint (`exec`), so it keeps the pid the runtime signals, as a container's PID 1
does. Before that, like a container runtime, it lays the image's tree under DIR (the instance's own
filesystem, `images.MappedImage`), starts in its `WORKDIR`, puts the image's `ENV` under the
environment it was given (which wins, as `docker run -e` does), and translates the image's paths in
the entrypoint, the command and the environment. Its `python` is the image's (`image_python`):
the packages the Dockerfile installs, not the rest of this host's environment.

Failures exit as `docker run` does, with one line on stderr that the bootstrap's exit report
quotes: 125 when the image cannot be run here, 127 when the program is not found, 126 when it
cannot be executed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpujobs_local.image_python import image_python
from gpujobs_local.images import IMAGES, ImageCatalog, ImageError, MappedImage

EXIT_CANNOT_RUN = 125
"""`docker run` itself failed (here: an image the local cloud cannot run)."""
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class ExecError(Exception):
    """The container's program could not be started; `code` is the exit status docker gives."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def container_argv(image: MappedImage, command: Sequence[str]) -> list[str]:
    """ENTRYPOINT + (the command, or CMD when none is given), image paths translated."""
    argv = [*image.recipe.entrypoint, *(command or image.recipe.cmd)]
    return [image.translate(word) for word in argv]


def container_env(image: MappedImage, given: Mapping[str, str]) -> dict[str, str]:
    """The image's ENV under `given`, every value's image paths translated."""
    merged = {**image.recipe.env, **given}
    return {name: image.translate(value) for name, value in merged.items()}


def with_image_python(env: Mapping[str, str], venv: Path) -> dict[str, str]:
    """`env` with the image's Python (`image_python`) first on PATH, as /usr/local/bin is in the image."""
    return {**env, "PATH": os.pathsep.join([str(venv / "bin"), env.get("PATH", os.defpath)]), "VIRTUAL_ENV": str(venv)}


def resolve(program: str, env: Mapping[str, str]) -> str:
    """The file `program` names, found as exec does (PATH for a bare name), or ExecError."""
    if "/" not in program:
        for folder in env.get("PATH", os.defpath).split(os.pathsep):
            candidate = os.path.join(folder or ".", program)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        raise ExecError(EXIT_NOT_FOUND, f'exec: "{program}": executable file not found in $PATH')
    if not os.path.exists(program):
        raise ExecError(EXIT_NOT_FOUND, f'exec: "{program}": no such file or directory')
    if os.path.isdir(program) or not os.access(program, os.X_OK):
        raise ExecError(EXIT_NOT_EXECUTABLE, f'exec: "{program}": permission denied')
    return program


def run(root: Path, image_ref: str, command: Sequence[str], *, catalog: ImageCatalog = IMAGES) -> int:
    """Set the container up and exec its program; returns only on failure, with docker's exit code."""
    try:
        image = MappedImage(recipe=catalog.recipe(image_ref), root=root)
        image.lay_out()
        argv = container_argv(image, command)
        env = with_image_python(container_env(image, os.environ), image_python(root, image.recipe.pip_requirements))
        if not argv:
            raise ExecError(EXIT_CANNOT_RUN, f"image {image_ref!r} has no ENTRYPOINT or CMD and no command was given")
        os.chdir(image.host_path(image.recipe.workdir))  # first: a relative program is found from there
        program = resolve(argv[0], env)
        os.execve(program, argv, env)  # noqa: S606 (argv from the image and the job, never a shell: as docker runs it)
    except ImageError as exc:
        return _fail(EXIT_CANNOT_RUN, str(exc))
    except ExecError as exc:
        return _fail(exc.code, str(exc))
    except OSError as exc:  # execve refused what looked runnable (e.g. an exec format error)
        return _fail(EXIT_NOT_EXECUTABLE, f"exec: {exc}")
    return EXIT_CANNOT_RUN  # not reached: execve replaced this process


def _fail(code: int, message: str) -> int:
    print(f"gpujobs-local container: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpujobs_local.container", description=__doc__)
    parser.add_argument("--root", type=Path, required=True, help="the instance's filesystem for the image's tree")
    parser.add_argument("image")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    return run(args.root, args.image, args.command)


if __name__ == "__main__":
    sys.exit(main())
