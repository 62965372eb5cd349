from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from moto import mock_aws
from moto.server import ThreadedMotoServer

from gpujobs_local.stack import MotoStack, load_function

__all__ = ["load_function"]

pytest_plugins = ["tests.call_ledger"]  # every AWS call a stack principal makes, checked against the template

# Powertools' logger and metrics are created once, when `gpujobs.runtime.observability` is first
# imported, and read their service and namespace from the environment then: a test module that
# imports it at collection (for a metric's name) must not leave them unset for every later test.
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "GpuJobs")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "gpujobs")

# Randomized tests: `ci` (the default) runs a few hundred sequences; `make soak` selects `soak`.
_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]
_SEQUENCES = {"max_examples": 300, "stateful_step_count": 100, "deadline": None, "suppress_health_check": _SLOW_IS_FINE}
settings.register_profile("ci", **_SEQUENCES, print_blob=True)
settings.register_profile("soak", **{**_SEQUENCES, "max_examples": 10_000})
settings.load_profile(os.environ.get("GPUJOBS_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """A moto server on loopback, for what runs in another process (the bootstrap, a launcher)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


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

        bootstrap.reset()
        yield built
        bootstrap.reset()


@pytest.fixture
def restored_environ() -> Iterator[None]:
    """For code that configures its process through os.environ (the demos): give the others theirs back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
