from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from moto import mock_aws

from tests.integration.stack import MotoStack

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_METRICS_NAMESPACE": "GpuJobs",
        "POWERTOOLS_SERVICE_NAME": "gpujobs",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def stack(aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoStack]:
    with mock_aws():
        built = MotoStack()
        for key, value in built.env.items():
            monkeypatch.setenv(key, value)
        from gpujobs.runtime import bootstrap

        bootstrap.job_service.cache_clear()
        yield built
        bootstrap.job_service.cache_clear()


def load_function(name: str) -> ModuleType:
    """Import functions/<name>/app.py under a unique module name, as Lambda would load it."""
    path = ROOT / "functions" / name / "app.py"
    spec = importlib.util.spec_from_file_location(f"functions_{name}_app", path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
