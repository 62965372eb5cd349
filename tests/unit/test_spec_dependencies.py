"""`setup:` and `requirements:` (issue 22): what a job needs beyond its image, said in the spec,
refused with the field named when it cannot work, and carried to the container unchanged."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.rundoc import run_document
from gpujobs.domain.spec import JobSpec, validate_spec
from gpujobs.domain.spec_errors import SpecError
from gpujobs.domain.spec_parts import setup_argv
from gpujobs.instance.rundoc import check_document
from gpujobs.instance.workload_env import container_env

NOW = datetime(2026, 12, 6, tzinfo=UTC)
CODE = {"code": "s3://team-bucket/code/train.tar.gz", "code_sha256": "0" * 64}


def a_spec(**fields: Any) -> JobSpec:
    base = {"name": "acc", "image": "train:1", "command": ["python", "train.py"], "instance_types": ["g5.xlarge"]}
    return validate_spec({**base, **fields})


def problems(**fields: Any) -> list[str]:
    with pytest.raises(SpecError) as caught:
        a_spec(**fields)
    return caught.value.problems


def test_a_setup_string_runs_through_the_containers_shell_and_a_list_as_argv() -> None:
    spec = a_spec(setup=["pip install --user einops && echo ok", ["apt-get", "install", "-y", "libaio1"]])

    assert [setup_argv(command) for command in spec.setup] == [
        ["/bin/sh", "-c", "pip install --user einops && echo ok"],
        ["apt-get", "install", "-y", "libaio1"],
    ]


def test_requirements_are_a_file_inside_the_code() -> None:
    spec = a_spec(requirements="envs/requirements.txt", **CODE)

    assert spec.requirements == "envs/requirements.txt"
    assert a_spec().requirements is None
    assert a_spec().setup == []


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"requirements": "requirements.txt"}, "requirements: 'requirements.txt' is a path inside code:, but the job"),
        ({"requirements": "/etc/requirements.txt", **CODE}, "requirements: '/etc/requirements.txt' is absolute"),
        ({"requirements": "../requirements.txt", **CODE}, "requirements: '../requirements.txt' must be a file's path"),
        ({"requirements": "a//b.txt", **CODE}, "requirements: 'a//b.txt' must be a file's path inside code:"),
        ({"requirements": "a\\b.txt", **CODE}, "requirements: 'a\\\\b.txt' must be a file's path inside code:"),
        ({"requirements": "r" * 256, **CODE}, "requirements: String should have at most 255 characters"),
        ({"requirements": "req\x1b.txt", **CODE}, "requirements: contains the control character U+001B"),
        ({"setup": "pip install einops"}, "setup: must be a list of commands: write setup: ['pip install einops']"),
        ({"setup": [" "]}, "setup[0]: is empty: give a command"),
        ({"setup": [[]]}, "setup[0]: must be a string (run by /bin/sh -c in the container) or a non-empty list"),
        ({"setup": [["pip", 3]]}, "setup[0]: must be a string (run by /bin/sh -c in the container) or a non-empty"),
        ({"setup": [["x"] * 257]}, "setup[0]: has 257 arguments, at most 256"),
        ({"setup": ["x" * 4097]}, "setup[0]: has 4097 characters, at most 4096"),
        ({"setup": ["true"] * 33}, "setup: has 33 commands, at most 32"),
        ({"setup": ["echo \x00"]}, "setup[0]: contains the control character U+0000"),
        ({"setup": [["echo", "\x1b[2J"]]}, "setup[0]: argument 1: contains the control character U+001B"),
    ],
)
def test_what_cannot_work_is_refused_naming_the_field(fields: dict[str, Any], expected: str) -> None:
    assert any(line.startswith(expected) for line in problems(**fields)), problems(**fields)


def test_the_container_is_told_the_setup_the_requirements_and_the_jobs_own_venv_cache() -> None:
    """Spec -> run document -> the bootstrap's stdlib check -> the workload's environment."""
    spec = a_spec(requirements="requirements.txt", setup=["nvidia-smi", ["echo", "a b"]], **CODE)
    job = Job.submitted(job_id="j-0123456789abcdef", spec=spec, now=NOW, message_id="m-1")
    doc = run_document(
        job,
        Attempt(number=1, started_at=NOW),
        bucket="b",
        event_bus="bus",
        region="us-east-1",
        log_group="",
        wait_for_attempt=None,
        report_key="",
        access={},
    )

    checked = check_document(json.loads(doc.model_dump_json()))
    env = container_env(checked, rank=0, master_addr="10.0.0.1", instance_id="i-1", region="us-east-1")

    assert json.loads(env["GPUJOBS_SETUP"]) == [["/bin/sh", "-c", "nvidia-smi"], ["echo", "a b"]]
    assert env["GPUJOBS_REQUIREMENTS"] == "requirements.txt"
    assert env["GPUJOBS_VENV_CACHE_URI"] == "s3://b/jobs/j-0123456789abcdef/venvs"  # the job's prefix only


def test_a_job_without_dependencies_tells_the_container_nothing_about_them() -> None:
    spec = a_spec()
    job = Job.submitted(job_id="j-0123456789abcdef", spec=spec, now=NOW, message_id="m-1")
    doc = run_document(
        job,
        Attempt(number=1, started_at=NOW),
        bucket="b",
        event_bus="bus",
        region="us-east-1",
        log_group="",
        wait_for_attempt=None,
        report_key="",
        access={},
    )

    env = container_env(check_document(doc.model_dump()), rank=0, master_addr="", instance_id="i", region="r")

    assert not {"GPUJOBS_SETUP", "GPUJOBS_REQUIREMENTS", "GPUJOBS_VENV_CACHE_URI"} & set(env)


def test_the_bootstrap_refuses_a_document_whose_setup_is_not_argv_lists() -> None:
    from gpujobs.instance.errors import BootstrapError

    doc = {"job_id": "j", "attempt": 1, "name": "n", "image": "i:1", "command": ["x"], "checkpoint_uri": "s3://b/k"}
    with pytest.raises(BootstrapError, match="setup must be a list of commands"):
        check_document({**doc, "setup": ["sh -c 'rm -rf /'"]})
