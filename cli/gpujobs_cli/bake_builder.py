"""What a `gpujobs bake` builder instance runs: pull the images into docker's store, report, power off.

This file's source travels in the builder's user data (`bake.builder_user_data`) and runs there as
root on the AMI's own python3 (3.9 on Amazon Linux 2023, 3.10 on the Ubuntu DLAMI), so it is
stdlib only and self-contained. What varies from one bake to the next (the image references, a
nonce, the deadline) is one base64 JSON string handed to `main`: no image name is ever parsed by a
shell, and every command runs from an argv list.

Steps: a dead man's `shutdown -h +N` (a builder whose `gpujobs bake` died powers itself off; its
volume is kept until someone terminates it), docker's daemon up, then for each image an ECR login
when its registry is ECR (the token from the registry's own region: `aws ecr get-login-password`,
else boto3), `docker pull` (timed) and the digests docker recorded. Then a logout from every
registry, so no token is baked into the AMI, and one report line on the serial console, which the
CLI reads with GetConsoleOutput once the builder has stopped:
`gpujobs-bake: ok <nonce> <base64 JSON of what was pulled>` or
`gpujobs-bake: failed <nonce> <base64 message>`. Then it powers off; its shutdown behaviour is
`stop`, so the CLI makes the AMI from the stopped volume.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

REPORT_PREFIX = "gpujobs-bake:"
ECR_REGISTRY = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?(?=/)")
"""The bootstrap's pattern (gpujobs/instance/runtimes.py); tests/unit/test_bake_builder.py keeps the two equal."""
DOCKER_WAIT_SECONDS = 300


class BakeError(Exception):
    """The bake cannot go on; the message is reported on the console."""


def main(encoded: str, *, docker: str = "docker", console: str = "/dev/console", shutdown: str = "shutdown") -> int:
    """Pull what `encoded` names, report on `console`, power off. Returns 0 when every image was pulled."""
    os.environ.setdefault("HOME", "/root")  # docker keeps its login under $HOME; cloud-init may not set it
    data = json.loads(base64.b64decode(encoded).decode("utf-8"))
    nonce = str(data["nonce"])
    _run([shutdown, "-h", f"+{int(data['deadline_minutes'])}"], check=False)
    try:
        pulled = pull_all([str(image) for image in data["images"]], docker=docker)
        report, code = f"ok {nonce} {_b64(json.dumps(pulled))}", 0
    except BakeError as exc:
        report, code = f"failed {nonce} {_b64(str(exc))}", 1
    say(f"{REPORT_PREFIX} {report}", console)
    _run([shutdown, "-h", "now"], check=False)
    return code


def pull_all(images: list[str], *, docker: str) -> list[dict[str, Any]]:
    """Pull every image; what docker recorded for each: its RepoDigests and how long the pull took."""
    _wait_for_docker(docker)
    registries: list[str] = []
    pulled: list[dict[str, Any]] = []
    try:
        for image in images:
            ecr = ECR_REGISTRY.match(image)
            if ecr and ecr.group(0) not in registries:
                _run([docker, "login", "--username", "AWS", "--password-stdin", ecr.group(0)], stdin=_password(ecr))
                registries.append(ecr.group(0))
            print(f"pulling {image}", flush=True)
            started = time.monotonic()
            _run([docker, "pull", image])
            seconds = round(time.monotonic() - started, 1)
            digests = json.loads(_run([docker, "image", "inspect", "--format", "{{json .RepoDigests}}", image]) or "[]")
            print(f"pulled {image} in {seconds}s: {digests}", flush=True)
            pulled.append({"image": image, "digests": digests or [], "seconds": seconds})
    finally:
        for registry in registries:  # the token must not be baked into the AMI
            _run([docker, "logout", registry], check=False)
    return pulled


def _wait_for_docker(docker: str) -> None:
    deadline = time.monotonic() + DOCKER_WAIT_SECONDS
    started = False
    while _run([docker, "info"], check=False) is None:
        if not started:
            _run(["systemctl", "start", "docker"], check=False)
            started = True
        if time.monotonic() > deadline:
            raise BakeError(f"docker's daemon did not answer within {DOCKER_WAIT_SECONDS}s")
        time.sleep(5)


def _password(ecr: re.Match[str]) -> str:
    """A login password for the ECR registry `ecr` names, fetched in that registry's region."""
    region = ecr.group(2)
    aws = shutil.which("aws")
    if aws:
        return str(_run([aws, "ecr", "get-login-password", "--region", region])).strip()
    try:
        boto3: Any = importlib.import_module("boto3")
    except ImportError:
        raise BakeError("neither the aws CLI nor boto3 is on this AMI: cannot log in to ECR") from None
    token = boto3.client("ecr", region_name=region).get_authorization_token(registryIds=[ecr.group(1)])
    return base64.b64decode(token["authorizationData"][0]["authorizationToken"]).decode().partition(":")[2]


def _run(argv: list[str], *, stdin: str = "", check: bool = True) -> str | None:
    """`argv`'s stdout; None when it failed and `check` is off. A failure with `check` is a BakeError."""
    try:
        done = subprocess.run(argv, input=stdin.encode(), capture_output=True, check=False, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if check:
            raise BakeError(f"{' '.join(argv[:3])}: {exc}") from None
        return None
    if done.returncode != 0:
        if check:
            raise BakeError(f"{' '.join(argv[:3])} failed ({done.returncode}): {done.stderr.decode()[-400:].strip()}")
        return None
    return done.stdout.decode(errors="replace")


def say(line: str, console: str) -> None:
    """`line` in this log and on the serial console, where GetConsoleOutput reads it."""
    print(line, flush=True)
    try:
        with open(console, "a", encoding="ascii") as out:
            out.write(f"\n{line}\n")
    except OSError as exc:
        print(f"cannot write to {console}: {exc}", file=sys.stderr, flush=True)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")
