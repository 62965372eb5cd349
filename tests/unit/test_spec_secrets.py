"""`secrets:` in a job spec: references to the team's own secrets, never values.

A secret's value never enters the control plane: the spec, the job record, the run document and
user data hold the reference; the instance resolves it with the job's credentials.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpujobs.domain.spec import validate_spec
from gpujobs.domain.spec_errors import SpecError

HF_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:gpujobs/vision/hf-AbC123"


def a_spec(**changes: Any) -> dict[str, Any]:
    return {
        "name": "train",
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
        "command": ["python", "train.py"],
        "instance_types": ["g5.xlarge"],
        "team": "vision",
        **changes,
    }


def problems(**changes: Any) -> str:
    with pytest.raises(SpecError) as raised:
        validate_spec(a_spec(**changes))
    return "\n".join(raised.value.problems)


def test_secrets_name_a_secrets_manager_arn_or_an_ssm_parameter_of_the_team() -> None:
    spec = validate_spec(a_spec(secrets={"HF_TOKEN": HF_ARN, "WANDB_API_KEY": "ssm:/gpujobs/vision/wandb"}))

    assert spec.secrets == {"HF_TOKEN": HF_ARN, "WANDB_API_KEY": "ssm:/gpujobs/vision/wandb"}


@pytest.mark.parametrize(
    "value",
    ["hf_abcdefghijklmnopqrstuvwxyz0123456789", "plain-password", "s3://bucket/key", "ssm:relative/path"],
)
def test_a_value_where_a_reference_belongs_is_rejected_without_echoing_it(value: str) -> None:
    found = problems(secrets={"HF_TOKEN": value})

    assert "secrets: HF_TOKEN: must be a reference" in found
    assert value not in found


@pytest.mark.parametrize(
    "reference",
    [
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:gpujobs/other-team/hf-AbC123",
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:prod/db-password-AbC123",
        "ssm:/gpujobs/other-team/wandb",
        "ssm:/gpujobs/visionary/wandb",
        "ssm:/aws/reference/secretsmanager/x",
    ],
)
def test_a_secret_outside_the_teams_prefix_is_rejected(reference: str) -> None:
    assert "team 'vision' may read only secrets named gpujobs/vision/..." in problems(secrets={"TOKEN": reference})


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "GPUJOBS_JOB_ID", "lower", "1ABC"])
def test_secret_names_follow_the_env_rules(name: str) -> None:
    assert problems(secrets={name: "ssm:/gpujobs/vision/x"}).startswith("secrets: ")


def test_a_secret_may_not_also_be_set_in_env() -> None:
    assert "'TOKEN' is also set in env" in problems(env={"TOKEN": "x"}, secrets={"TOKEN": "ssm:/gpujobs/vision/t"})
