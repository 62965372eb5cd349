"""A local instance runs a job as its image would: the image's tree, ENV, WORKDIR and ENTRYPOINT
come from the Dockerfile, and what cannot run fails as `docker run` fails (125, 126, 127) with a
line that says why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from gpujobs_local.container import (
    EXIT_CANNOT_RUN,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    ExecError,
    container_argv,
    container_env,
    resolve,
)
from gpujobs_local.images import IMAGES, ImageCatalog, ImageError, MappedImage, read_dockerfile, repository_name

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:latest"


def _image(tmp_path: Path, dockerfile: str, files: dict[str, str]) -> tuple[ImageCatalog, Path]:
    context = tmp_path / "context"
    context.mkdir()
    for name, text in files.items():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        (context / name).write_text(text)
    (context / "Dockerfile").write_text(dockerfile)
    return ImageCatalog(dockerfiles={"app": (context / "Dockerfile", context)}), tmp_path / "rootfs"


def _run_container(catalog_dir: Path, root: Path, image: str, *command: str) -> subprocess.CompletedProcess[str]:
    """The container program as the bootstrap starts it, in a child process (it execs)."""
    script = (
        "import sys; from pathlib import Path; from gpujobs_local.container import run; "
        "from gpujobs_local.images import ImageCatalog; "
        f"c = Path({str(catalog_dir)!r}); "
        "sys.exit(run(Path(sys.argv[1]), sys.argv[2], sys.argv[3:], "
        "catalog=ImageCatalog(dockerfiles={'app': (c / 'Dockerfile', c)})))"
    )
    return subprocess.run(
        [sys.executable, "-c", script, str(root), image, *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"},
    )


def test_the_training_image_is_read_from_its_dockerfile_not_from_code() -> None:
    recipe = IMAGES.recipe(EXAMPLES_IMAGE)

    assert recipe.entrypoint == ("python", "-m", "gpujobs_trainer.launch", "--")
    assert recipe.workdir == PurePosixPath("/home/trainer")
    assert recipe.env["PYTHONPATH"] == "/opt/gpujobs"
    placed = {copy.destination: copy.sources for copy in recipe.copies}
    assert placed[PurePosixPath("/opt/gpujobs/gpujobs_trainer")] == ((ROOT / "training_image" / "gpujobs_trainer"),)
    assert placed[PurePosixPath("/opt/gpujobs/examples")] == ((ROOT / "training_image" / "examples"),)


def test_every_name_of_the_training_image_means_the_same_dockerfile() -> None:
    assert repository_name(EXAMPLES_IMAGE) == "gpujobs-train"
    assert repository_name("local/gpujobs-train:dev") == "gpujobs-train"
    assert repository_name("registry:5000/team/gpujobs-train@sha256:abc") == "gpujobs-train"
    assert IMAGES.recipe("local/gpujobs-train:dev") == IMAGES.recipe(EXAMPLES_IMAGE)


def test_an_image_the_local_cloud_cannot_run_is_named_with_what_it_can_run() -> None:
    with pytest.raises(ImageError, match=r"cannot run image 'pytorch/pytorch:2\.5'.*gpujobs-train"):
        IMAGES.recipe("pytorch/pytorch:2.5")


def test_the_examples_command_runs_the_script_the_image_copied(tmp_path: Path) -> None:
    # given the examples' command, written for the image's tree
    image = MappedImage(recipe=IMAGES.recipe(EXAMPLES_IMAGE), root=tmp_path / "rootfs")
    image.lay_out()

    argv = container_argv(image, ["python", "/opt/gpujobs/examples/digits/train.py", "--steps", "600"])
    env = container_env(image, {"PATH": "/usr/bin", "TMPDIR": "/tmp/instance", "GPUJOBS_JOB_ID": "j-1"})

    # then it runs the launcher on the copy of the example under this instance's root
    script = tmp_path / "rootfs" / "opt" / "gpujobs" / "examples" / "digits" / "train.py"
    assert argv == ["python", "-m", "gpujobs_trainer.launch", "--", "python", str(script), "--steps", "600"]
    assert script.read_bytes() == (ROOT / "training_image" / "examples" / "digits" / "train.py").read_bytes()
    # with the image's environment mapped the same way, under what the instance was given
    assert env["PYTHONPATH"] == str(tmp_path / "rootfs" / "opt" / "gpujobs")
    assert env["GPUJOBS_LOCAL_CHECKPOINT_DIR"] == str(tmp_path / "rootfs" / "var" / "lib" / "gpujobs" / "checkpoints")
    assert (env["PATH"], env["TMPDIR"], env["GPUJOBS_JOB_ID"]) == ("/usr/bin", "/tmp/instance", "j-1")
    assert (tmp_path / "rootfs" / "home" / "trainer").is_dir()


def test_only_the_images_own_paths_are_mapped(tmp_path: Path) -> None:
    image = MappedImage(recipe=IMAGES.recipe(EXAMPLES_IMAGE), root=tmp_path)

    assert image.translate("--out=/home/trainer/model") == f"--out={tmp_path}/home/trainer/model"
    assert image.translate("/opt/gpujobs:/usr/lib/python3") == f"{tmp_path}/opt/gpujobs:/usr/lib/python3"
    for host_or_other in ["/srv/repo/train.py", "/opt/gpujobsX", "/home/someone", "s3://bucket/key", "python"]:
        assert image.translate(host_or_other) == host_or_other


def test_the_given_environment_wins_over_the_images_env_as_docker_run_e_does(tmp_path: Path) -> None:
    image = MappedImage(recipe=IMAGES.recipe(EXAMPLES_IMAGE), root=tmp_path)

    env = container_env(image, {"GPUJOBS_SHUTDOWN_TIMEOUT": "5", "DATA": "/opt/gpujobs/examples"})

    assert env["GPUJOBS_SHUTDOWN_TIMEOUT"] == "5"
    assert env["DATA"] == f"{tmp_path}/opt/gpujobs/examples"


def test_a_dockerfile_is_read_as_docker_reads_it(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "b.txt").write_text("b")
    dockerfile.write_text(
        "FROM builder AS build\nENV STAGE=one\nFROM python:3.11-slim\n"
        "# a comment\nENV A=1 \\\n    B='two words'\nENV LEGACY the rest of the line\n"
        "WORKDIR /srv\nWORKDIR app\nCOPY a.txt b.txt files/\nCOPY --chown=1:1 a.txt /etc/a.conf\n"
        'ENTRYPOINT exec serve\nCMD ["--port", "80"]\n'
    )

    recipe = read_dockerfile(dockerfile, context=tmp_path)

    assert recipe.env == {"A": "1", "B": "two words", "LEGACY": "the rest of the line"}  # the last stage only
    assert recipe.workdir == PurePosixPath("/srv/app")
    assert [(c.destination, c.into_folder) for c in recipe.copies] == [
        (PurePosixPath("/srv/app/files"), True),
        (PurePosixPath("/etc/a.conf"), False),
    ]
    assert recipe.entrypoint == ("/bin/sh", "-c", "exec serve")
    assert recipe.cmd == ("--port", "80")


@pytest.mark.parametrize(
    "line",
    ["COPY --from=build /x /y", "COPY ../outside /y", "ADD https://example.com/x /y", "ENV A=$HOME"],
)
def test_what_the_local_cloud_cannot_replay_is_refused_by_name(tmp_path: Path, line: str) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM scratch\n{line}\n")

    with pytest.raises(ImageError, match=r"local cloud|not in the build context"):
        read_dockerfile(tmp_path / "Dockerfile", context=tmp_path)


def test_a_program_is_found_as_exec_finds_it_or_refused_with_dockers_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")

    with pytest.raises(ExecError) as not_executable:
        resolve(str(script), {"PATH": str(tmp_path)})
    assert not_executable.value.code == EXIT_NOT_EXECUTABLE
    script.chmod(0o755)
    assert resolve("run.sh", {"PATH": str(tmp_path)}) == str(script)
    for missing in ["trian.sh", str(tmp_path / "missing.sh")]:
        with pytest.raises(ExecError) as not_found:
            resolve(missing, {"PATH": str(tmp_path)})
        assert not_found.value.code == EXIT_NOT_FOUND


def test_the_container_runs_its_entrypoint_in_the_images_tree(tmp_path: Path) -> None:
    dockerfile = (
        "FROM python:3.11\nENV GREETING=hello\nCOPY app /opt/app\nWORKDIR /opt/app\n"
        'ENTRYPOINT ["python", "/opt/app/main.py"]\n'
    )
    main = "import os, sys; print(os.environ['GREETING'], os.getcwd(), *sys.argv[1:])"
    catalog, root = _image(tmp_path, dockerfile, {"app/main.py": main})

    done = _run_container(tmp_path / "context", root, "registry/app:1", "/opt/app/data")

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hello", str(root / "opt" / "app"), str(root / "opt" / "app" / "data")]
    assert catalog.recipe("app").workdir == PurePosixPath("/opt/app")


@pytest.mark.parametrize(
    ("entrypoint", "code", "said"),
    [
        ('["no-such-program"]', EXIT_NOT_FOUND, 'exec: "no-such-program": executable file not found in $PATH'),
        ('["/opt/app/missing.sh"]', EXIT_NOT_FOUND, "no such file or directory"),
        ('["/opt/app/data.txt"]', EXIT_NOT_EXECUTABLE, "permission denied"),
    ],
)
def test_a_program_that_cannot_start_exits_as_docker_run_does_with_one_line_why(
    tmp_path: Path, entrypoint: str, code: int, said: str
) -> None:
    _image(tmp_path, f"FROM x\nCOPY app /opt/app\nENTRYPOINT {entrypoint}\n", {"app/data.txt": "not a program"})

    done = _run_container(tmp_path / "context", tmp_path / "rootfs", "app:1")

    assert done.returncode == code
    last_line = done.stderr.strip().splitlines()[-1]
    assert said in last_line
    assert "/opt/app" in last_line or "no-such-program" in last_line


def test_an_unknown_image_exits_125_naming_the_image(tmp_path: Path) -> None:
    _image(tmp_path, 'FROM x\nCMD ["true"]\n', {})

    done = _run_container(tmp_path / "context", tmp_path / "rootfs", "busybox:latest", "true")

    assert done.returncode == EXIT_CANNOT_RUN
    assert "cannot run image 'busybox:latest'" in done.stderr
