"""`secrets:` in a job spec: references to the team's own secrets, never values.

A secret's value never enters the control plane: the spec, the job record, the run document and
user data hold the reference; the instance resolves it with the job's credentials.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpujobs.domain.spec import JobSpec, validate_spec
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


# ---- credentials in env: refused at submission, naming the variable, pointing to secrets:

CREDENTIALS_IN_ENV = {
    "a W&B key (its name)": ("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567"),
    "a database password (its name)": ("DB_PASSWORD", "hunter2"),
    "a password (its name)": ("PASSWORD", "correct horse battery staple"),
    "a client secret (its name)": ("OAUTH_CLIENT_SECRET", "s3cr3t"),
    "a reference put in env (its name)": ("WANDB_API_KEY", "ssm:/gpujobs/vision/wandb"),
    "a token under a _TOKEN name": ("HF_TOKEN", "A1b2C3d4E5f6G7h8J9k0"),
    "a short Hugging Face token": ("MODEL_ACCESS", "hf_abc12345"),
    "a Stripe key (detect-secrets)": ("BILLING", "sk_live_" + "a1B2" * 6),
    "a JSON Web Token (detect-secrets)": ("SESSION", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"),
    "a URL with a password (detect-secrets)": ("MLFLOW_TRACKING_URI", "https://me:pa55w0rd@mlflow.example.com"),
    "a private key (detect-secrets)": ("SIGNING", "-----BEGIN RSA PRIVATE KEY-----"),
    "a PyPI token (detect-secrets)": ("UPLOAD", "pypi-AgEIcHlwaS5vcmc" + "a1B2" * 18),
}


@pytest.mark.parametrize(("name", "value"), CREDENTIALS_IN_ENV.values(), ids=CREDENTIALS_IN_ENV.keys())
def test_a_credential_in_env_is_refused_naming_the_variable_and_pointing_to_secrets(name: str, value: str) -> None:
    found = problems(env={name: value})

    assert found.startswith(f"env: {name!r} looks like "), found
    assert "pass credentials with the spec's `secrets:` field" in found
    assert value not in found


NOT_CREDENTIALS = {
    "a commit id": ("COMMIT", "0123456789abcdef0123456789abcdef01234567"),
    "a tokenizer's pad token": ("PAD_TOKEN", "<pad>"),
    "a sort key": ("SORT_KEY", "step"),
    "a model named under _KEY": ("MODEL_KEY", "bert-base-uncased-v2"),
    "a switch under a credential name": ("USE_AUTH_TOKEN", "true"),
    "an empty password": ("DB_PASSWORD", ""),
    "a token count": ("MAX_TOKENS", "4096"),
    "a master's public address": ("MASTER_HOST", "8.8.8.8"),
    "a plain URL": ("MLFLOW_TRACKING_URI", "https://mlflow.example.com"),
    "a secret's name": ("SECRET_NAME", "gpujobs/vision/hf"),
}


@pytest.mark.parametrize(("name", "value"), NOT_CREDENTIALS.values(), ids=NOT_CREDENTIALS.keys())
def test_an_ordinary_value_is_accepted_in_env(name: str, value: str) -> None:
    assert validate_spec(a_spec(env={name: value})).env == {name: value}


def test_a_stored_job_accepted_before_the_name_rules_stays_readable() -> None:
    """The name rules and detect-secrets judge a submission; a job read back from the table keeps
    its spec (it was accepted then, and its env cannot be changed now)."""
    stored = {**a_spec(env={"WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567"}), "client_token": "t"}

    assert JobSpec.model_validate(stored).env["WANDB_API_KEY"]
    with pytest.raises(SpecError):
        validate_spec(stored)
