from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from moto import mock_aws
from moto.server import ThreadedMotoServer

from gpujobs_local.stack import MotoStack, load_function
from tests.ami_pythons import AMI_PYTHONS, MissingPythonError, ami_python

__all__ = ["load_function"]

# tests.call_ledger: every AWS call a stack principal makes, checked against the template;
# tests.folders: the markers each folder gives its tests, and the parallel run's torch group.
pytest_plugins = ["tests.call_ledger", "tests.folders"]

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


@dataclass(frozen=True)
class BootstrapPython:
    """An interpreter to run the bootstrap with, and the version it says it is."""

    path: str
    version: str


@functools.cache
def ami_bootstrap_python(version: str) -> BootstrapPython:
    """`tests.ami_pythons.ami_python(version)`, once a session; skipped where the interpreter is
    missing, failed on CI."""
    try:
        path = str(ami_python(version))
    except MissingPythonError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}: CI must run the bootstrap under Python {version} ({AMI_PYTHONS[version]})")
        pytest.skip(str(exc))
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"cannot make the Python {version} environment: {exc.cmd}\n{exc.stdout}\n{exc.stderr}")
    said = subprocess.check_output([path, "-c", "import platform; print(platform.python_version())"], text=True)
    return BootstrapPython(path=path, version=said.strip())


# Function-scoped parameters (the environments are made once, above): a session-scoped parameter would
# make pytest interleave the modules that use it, restarting their module-scoped moto servers over
# moto's one in-process state.
@pytest.fixture(params=list(AMI_PYTHONS), ids=[f"py{v}" for v in AMI_PYTHONS])
def old_python(request: pytest.FixtureRequest) -> BootstrapPython:
    """Each AMI's oldest python3 (3.9, 3.10), in an environment holding only boto3 (tests/ami_pythons.py)."""
    return ami_bootstrap_python(request.param)


@pytest.fixture(params=["", *AMI_PYTHONS], ids=["this-python", *(f"py{v}" for v in AMI_PYTHONS)])
def bootstrap_python(request: pytest.FixtureRequest) -> BootstrapPython:
    """The interpreters a bootstrap process is run under: this one, then each AMI's oldest (`old_python`)."""
    if not request.param:
        return BootstrapPython(path=sys.executable, version=platform.python_version())
    return ami_bootstrap_python(request.param)
