"""A replacement on a baked AMI starts without pulling its image, unless the copy there may be stale.

Boot is most of what a spot interruption costs, and the image pull most of the boot. An AMI baked
with the image (`gpujobs bake`) holds it already; the bootstrap skips the pull only when that copy
is provably the one the job asks for (gpujobs/instance/images.py): an image pinned by digest that
docker finds, or an ECR tag whose registry digest is one the host recorded when it pulled it. Every
other case pulls, as before, and the log says which path was taken and how long a pull took.

Each story runs the bundled bootstrap's `DockerRuntime.prepare` as a process under this Python and
the AMIs' 3.9 and 3.10 (`bootstrap_python`), against a fake `docker` that holds a given set of
images and a fake ECR client that answers what the registry's tag names now.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpujobs.instance import images
from gpujobs.instance.userdata import unpack_bootstrap
from tests.conftest import BootstrapPython

REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com/train"
OLD, NEW = "sha256:" + "a" * 64, "sha256:" + "b" * 64
DLC = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training"

FAKE_DOCKER = """import json, os, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\\n")
sys.stdin.read()
if argv[:2] == ["image", "inspect"]:
    held = json.loads(os.environ["FAKE_DOCKER_IMAGES"])
    if argv[-1] not in held:
        sys.exit("Error: No such image: " + argv[-1])
    print(json.dumps(held[argv[-1]]))
"""
"""A docker holding FAKE_DOCKER_IMAGES (what `docker image inspect REF` finds -> its RepoDigests)."""

DRIVER = """import json, sys
from gpujobs.instance import aws, runtimes
config = json.loads(sys.argv[1])
asked = []

class FakeEcr:
    def __init__(self, region):
        self.meta = type("Meta", (), {"region_name": region})()

    def get_authorization_token(self, **kwargs):
        asked.append([self.meta.region_name, "GetAuthorizationToken", kwargs])
        return {"authorizationData": [{"authorizationToken": "QVdTOnNlY3JldA=="}]}

    def batch_get_image(self, **kwargs):
        asked.append([self.meta.region_name, "BatchGetImage", kwargs])
        if config["registry"] == "refused":
            from botocore.exceptions import ClientError
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not allowed"}}, "BatchGetImage")
        return config["registry"]

aws.client = lambda service, region, **_: FakeEcr(region)
doc = {"image": config["image"], "env": {}, "trainer_env": {}}
runtimes.DockerRuntime(config["docker"]).prepare(doc, lambda service: FakeEcr("us-east-1"))
print("ECR " + json.dumps(asked))
"""
"""The bundled bootstrap's prepare step, the job running in us-east-1 (the bootstrap's clients' region)."""


class Prepared:
    """What one prepare did: docker's calls, ECR's, and the bootstrap's log lines."""

    def __init__(self, docker_calls: list[list[str]], ecr_calls: list[list[Any]], log: list[str]) -> None:
        self.docker_calls, self.ecr_calls, self.log = docker_calls, ecr_calls, log

    @property
    def pulled(self) -> bool:
        return any(call[0] == "pull" for call in self.docker_calls)

    @property
    def logged_in(self) -> bool:
        return any(call[0] == "login" for call in self.docker_calls)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.log)


@pytest.fixture
def prepare(tmp_path: Path, bootstrap_python: BootstrapPython) -> Any:
    bundle = unpack_bootstrap(tmp_path / "bundle")
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(0o755)

    def run(image: str, *, held: dict[str, list[str]], registry: Any = None) -> Prepared:
        calls = tmp_path / "docker-calls.jsonl"
        calls.unlink(missing_ok=True)
        config = {"image": image, "docker": str(docker), "registry": registry}
        done = subprocess.run(
            [bootstrap_python.path, "-c", DRIVER, json.dumps(config)],
            env={
                "PYTHONPATH": str(bundle),
                "FAKE_DOCKER_LOG": str(calls),
                "FAKE_DOCKER_IMAGES": json.dumps(held),
                "PATH": "/usr/bin:/bin",
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        docker_calls = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
        return Prepared(docker_calls, json.loads(lines[-1].removeprefix("ECR ")), lines[:-1])

    return run


def a_registry_answer(digest: str) -> dict[str, Any]:
    """ECR's BatchGetImage answer for one tag that names `digest`."""
    manifest = json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + "c" * 64}})
    return {"images": [{"imageId": {"imageTag": "1", "imageDigest": digest}, "imageManifest": manifest}]}


# ---- pinned by digest ---------------------------------------------------------------------------
def test_an_image_pinned_by_digest_that_the_host_holds_is_neither_logged_in_to_nor_pulled(prepare: Any) -> None:
    # given an AMI baked with the job's image, pinned by digest
    image = f"{REPO}:1@{NEW}"

    # when the bootstrap prepares it
    done = prepare(image, held={f"{REPO}@{NEW}": [f"{REPO}@{NEW}"]})

    # then docker was only asked whether it holds it, and the registry not at all
    assert done.docker_calls == [["image", "inspect", "--format", "{{json .RepoDigests}}", f"{REPO}@{NEW}"]]
    assert done.ecr_calls == []
    assert done.said(f"image present, pull skipped: {image} (pinned by digest {NEW})")


def test_an_image_pinned_by_digest_that_the_host_lacks_is_pulled_and_the_pull_is_timed(prepare: Any) -> None:
    done = prepare(f"{REPO}@{NEW}", held={f"{REPO}@{OLD}": [f"{REPO}@{OLD}"]})

    assert done.logged_in
    assert done.docker_calls[-1] == ["pull", f"{REPO}@{NEW}"]
    assert done.said(f"pulling {REPO}@{NEW}: not on this host")
    assert done.said(f"pulled {REPO}@{NEW} in ")


# ---- a tag --------------------------------------------------------------------------------------
def test_a_tag_the_host_holds_is_not_pulled_while_the_registry_still_names_the_same_image(prepare: Any) -> None:
    # given a host that pulled train:1 when it named NEW, and a registry where it still does
    done = prepare(f"{REPO}:1", held={f"{REPO}:1": [f"{REPO}@{NEW}"]}, registry=a_registry_answer(NEW))

    # then the registry was asked what the tag names, and nothing was pulled
    assert not done.pulled
    assert not done.logged_in
    assert done.ecr_calls == [
        [
            "us-east-1",
            "BatchGetImage",
            {
                "registryId": "123456789012",
                "repositoryName": "train",
                "imageIds": [{"imageTag": "1"}],
                "acceptedMediaTypes": images.MANIFEST_TYPES,
            },
        ]
    ]
    assert done.said(f"image present, pull skipped: {REPO}:1 (the registry's tag names {NEW}, as on this host)")


def test_a_tag_the_host_holds_is_pulled_once_the_registry_names_another_image(prepare: Any) -> None:
    # given an AMI baked when train:1 named OLD, and the tag pushed again since
    done = prepare(f"{REPO}:1", held={f"{REPO}:1": [f"{REPO}@{OLD}"]}, registry=a_registry_answer(NEW))

    # then the stale copy is not run: the image is pulled
    assert done.logged_in
    assert done.docker_calls[-1] == ["pull", f"{REPO}:1"]
    assert done.said(f"pulling {REPO}:1: stale: the registry's tag names ")
    assert done.said(f"this host has {OLD}")


def test_a_tag_is_pulled_when_the_registry_cannot_say_what_it_names(prepare: Any) -> None:
    refused = prepare(f"{REPO}:1", held={f"{REPO}:1": [f"{REPO}@{NEW}"]}, registry="refused")
    gone = prepare(f"{REPO}:1", held={f"{REPO}:1": [f"{REPO}@{NEW}"]}, registry={"images": [], "failures": [{}]})

    assert refused.pulled
    assert refused.said("cannot ask the registry what the tag names (An error occurred (AccessDeniedException)")
    assert gone.pulled
    assert gone.said("the registry has no image under this tag")


def test_a_tag_of_another_regions_registry_is_checked_in_that_region(prepare: Any) -> None:
    image = f"{DLC}:2.5.1-gpu-py311-cu124-ubuntu22.04-ec2"

    done = prepare(image, held={image: [f"{DLC}@{NEW}"]}, registry=a_registry_answer(NEW))

    assert not done.pulled
    ((region, operation, asked),) = done.ecr_calls
    assert (region, operation, asked["registryId"]) == ("us-west-2", "BatchGetImage", "763104351884")


def test_a_tag_the_registry_names_by_its_manifest_digest_alone_is_not_pulled(prepare: Any) -> None:
    """The SHA-256 of the manifest ECR returns is a content address too: equal to the host's, it is the same image."""
    answer = a_registry_answer(OLD)
    manifest_digest = next(iter(images.registry_digests(answer) - {OLD}))

    done = prepare(f"{REPO}:1", held={f"{REPO}:1": [f"{REPO}@{manifest_digest}"]}, registry=answer)

    assert not done.pulled


def test_a_tag_outside_ecr_or_one_the_host_built_itself_is_always_pulled(prepare: Any) -> None:
    hub = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    outside = prepare(hub, held={hub: [f"pytorch/pytorch@{NEW}"]})
    built = prepare(f"{REPO}:1", held={f"{REPO}:1": []}, registry=a_registry_answer(NEW))

    assert outside.pulled
    assert not outside.logged_in
    assert outside.said(f"pulling {hub}: a tag outside ECR is not checked against its registry")
    assert built.pulled
    assert built.ecr_calls[-1][1] == "GetAuthorizationToken"  # the registry was not asked what the tag names
    assert built.said("the copy on this host has no registry digest to compare")


def test_an_image_the_host_lacks_is_pulled_without_asking_the_registry_first(prepare: Any) -> None:
    done = prepare(f"{REPO}:1", held={})

    assert [call[0] for call in done.docker_calls] == ["image", "login", "pull"]
    assert [operation for _, operation, _ in done.ecr_calls] == ["GetAuthorizationToken"]
    assert done.said(f"pulling {REPO}:1: not on this host")


# ---- the reference grammar ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("img:1", ("img", "1", "")),
        ("ubuntu", ("ubuntu", "", "")),
        ("localhost:5000/team/img:v2", ("localhost:5000/team/img", "v2", "")),
        (f"{REPO}:1@{NEW}", (REPO, "1", NEW)),
        (f"{REPO}@{NEW}", (REPO, "", NEW)),
    ],
)
def test_image_references_split_into_name_tag_and_digest(image: str, expected: tuple[str, str, str]) -> None:
    assert images.parse(image) == expected


@pytest.mark.parametrize(
    "image",
    ["", "img:1 --privileged", "img;id", "$(id)", "img:1\nimg:2", "IMG:1", "img@sha256:short", "a" * 600, "img:-x"],
)
def test_anything_but_a_plain_reference_is_refused(image: str) -> None:
    assert images.parse(image) is None
