"""A function deployed without a setting it needs fails its cold start, naming what is missing.

Not later, as a FAILED job or a dropped event: the import of the handler raises SettingsError
with the name of every missing variable. Each function requires what its code paths use, and no
more: a function that never launches deploys without the launch settings.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujobs.runtime import bootstrap
from gpujobs.runtime.settings import SettingsError
from tests.conftest import load_function

ROOT = Path(__file__).resolve().parents[2]
EVERY_FUNCTION = {"JOBS_TABLE", "EVENT_BUS_NAME", "GPUJOBS_STACK_NAME"}
LAUNCH = {"LAUNCH_TEMPLATE_ID", "SECURITY_GROUP_ID", "SUBNET_IDS", "CHECKPOINT_BUCKET", "REPORT_SECRET_ARN"}
SIGNAL = {"CHECKPOINT_DOCUMENT"}
ADMIT = {"ALLOWED_INSTANCE_TYPES"}

REQUIRED = {
    "submit": EVERY_FUNCTION | ADMIT | LAUNCH,
    "spot": EVERY_FUNCTION | LAUNCH | SIGNAL,
    "instance_state": EVERY_FUNCTION | LAUNCH,
    "reports": EVERY_FUNCTION | LAUNCH,
    "idle": EVERY_FUNCTION | SIGNAL,
    "budget": EVERY_FUNCTION | SIGNAL,
    "reconciler": EVERY_FUNCTION | LAUNCH | SIGNAL,
}
DEPLOYED_ENV = {
    "JOBS_TABLE": "gpujobs-jobs",
    "EVENT_BUS_NAME": "gpujobs-jobs",
    "GPUJOBS_STACK_NAME": "gpujobs",
    "CHECKPOINT_BUCKET": "gpujobs-checkpoints",
    "JOBS_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/gpujobs-jobs",
    "LAUNCH_TEMPLATE_ID": "lt-0123456789abcdef0",
    "SECURITY_GROUP_ID": "sg-0123456789abcdef0",
    "SUBNET_IDS": "subnet-a,subnet-b",
    "ALLOWED_INSTANCE_TYPES": "g5.xlarge,g6.xlarge",
    "CHECKPOINT_DOCUMENT": "gpujobs-checkpoint-now",
    "REPORT_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:gpujobs-report-AbCdEf",
}
CASES = [
    pytest.param(name, variable, id=f"{name}-{variable}") for name in REQUIRED for variable in sorted(REQUIRED[name])
]


@pytest.fixture
def deployed(aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The environment the template gives every function; each test takes away what it is about."""
    for key, value in DEPLOYED_ENV.items():
        monkeypatch.setenv(key, value)
    bootstrap.reset()
    yield monkeypatch
    bootstrap.reset()


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_function_imports_with_the_settings_the_template_gives_it(
    deployed: pytest.MonkeyPatch, name: str
) -> None:
    assert callable(load_function(name).handler)


@pytest.mark.parametrize(("name", "variable"), CASES)
def test_a_function_missing_a_setting_it_needs_fails_at_import_naming_it(
    deployed: pytest.MonkeyPatch, name: str, variable: str
) -> None:
    deployed.delenv(variable)

    with pytest.raises(SettingsError, match=variable):
        load_function(name)


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_an_empty_setting_counts_as_missing(deployed: pytest.MonkeyPatch, name: str) -> None:
    deployed.setenv("JOBS_TABLE", "")

    with pytest.raises(SettingsError, match="JOBS_TABLE"):
        load_function(name)


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_the_error_names_every_missing_setting_at_once(deployed: pytest.MonkeyPatch, name: str) -> None:
    for variable in REQUIRED[name]:
        deployed.delenv(variable)

    with pytest.raises(SettingsError) as raised:
        load_function(name)

    named = set(str(raised.value).split(": ", 1)[1].split(", "))
    assert named == REQUIRED[name]


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_a_function_does_not_require_settings_it_never_uses(deployed: pytest.MonkeyPatch, name: str) -> None:
    for variable in set(DEPLOYED_ENV) - REQUIRED[name]:
        deployed.delenv(variable)

    assert callable(load_function(name).handler)


def test_a_fresh_interpreter_fails_the_cold_start_with_the_missing_name(deployed: pytest.MonkeyPatch) -> None:
    deployed.delenv("SUBNET_IDS")
    deployed.delenv("CHECKPOINT_DOCUMENT")
    code = "import runpy; runpy.run_path('functions/reconciler/app.py')"

    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )

    assert result.returncode != 0
    assert "SettingsError: missing environment variables: SUBNET_IDS, CHECKPOINT_DOCUMENT" in result.stderr
