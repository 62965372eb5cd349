"""An image in another account's registry in another region (the AWS Deep Learning Containers,
account 763104351884) is pulled with a login token from that registry's region.

Before, the token was always asked for in the job's region: a job in us-east-1 whose image lives in
us-west-2's registry logged in with a token that registry does not take, and the pull failed.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpujobs.instance import aws, rundoc, runtimes

FAKE_DOCKER = """import json, os, sys
if sys.argv[1:3] == ["image", "inspect"]:
    sys.exit("Error: No such image")  # not on the host: it is pulled
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"argv": sys.argv[1:], "stdin": sys.stdin.read() if sys.argv[1] == "login" else ""}) + "\\n")
"""
TOKEN = base64.b64encode(b"AWS:registry-password").decode()


class FakeEcr:
    """An ECR client of one region (`meta.region_name`, as boto3's), recording what it is asked."""

    def __init__(self, region: str, asked: list[tuple[str, dict[str, Any]]]) -> None:
        self.region, self.asked = region, asked
        self.meta = SimpleNamespace(region_name=region)

    def get_authorization_token(self, **kwargs: Any) -> dict[str, Any]:
        self.asked.append((self.region, kwargs))
        return {"authorizationData": [{"authorizationToken": TOKEN}]}


def _prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image: str) -> tuple[list[Any], list[dict[str, Any]]]:
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(0o755)
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "calls.jsonl"))
    asked: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(aws, "client", lambda service, region, **_: FakeEcr(f"{region} (a new client)", asked))
    doc = rundoc.check_document(
        {
            "job_id": "j-0123456789abcdef",
            "attempt": 1,
            "name": "n",
            "image": image,
            "command": ["torchrun", "train.py"],
            "gpus_per_node": 0,
            "checkpoint_uri": "s3://b/k",
            "region": "us-east-1",
        }
    )
    runtime = runtimes.DockerRuntime(str(docker))
    runtime.prepare(doc, lambda service: FakeEcr("us-east-1", asked))  # the bootstrap's clients: the job's region
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    return asked, calls


def test_a_deep_learning_container_of_another_region_is_pulled_with_that_regions_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.5.1-gpu-py311-cu124-ubuntu22.04-ec2"

    asked, (login, pull) = _prepare(tmp_path, monkeypatch, image)

    assert asked == [("us-west-2 (a new client)", {"registryIds": ["763104351884"]})]
    assert login["argv"] == [
        "login",
        "--username",
        "AWS",
        "--password-stdin",
        "763104351884.dkr.ecr.us-west-2.amazonaws.com",
    ]
    assert login["stdin"] == "registry-password"
    assert pull["argv"] == ["pull", image]


def test_an_image_of_the_jobs_own_region_still_uses_the_bootstraps_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked, (login, _) = _prepare(tmp_path, monkeypatch, "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1")

    assert asked == [("us-east-1", {"registryIds": ["123456789012"]})]
    assert login["argv"][-1] == "123456789012.dkr.ecr.us-east-1.amazonaws.com"


def test_an_image_outside_ecr_is_pulled_without_a_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked, (pull,) = _prepare(tmp_path, monkeypatch, "public.ecr.aws/docker/library/python:3.12")

    assert asked == []
    assert pull["argv"] == ["pull", "public.ecr.aws/docker/library/python:3.12"]
