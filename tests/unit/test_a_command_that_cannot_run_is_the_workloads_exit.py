"""A command that is not there, or cannot be executed, ends the workload as a shell or `docker run`
reports it (127, 126, reason `exited`), never as the bootstrap's own failure (125): the control
plane takes the first two for a configuration error and fails the job at once, the last it retries.
The process runtime (the local cloud) must say the same as docker on EC2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpujobs.instance.contract import EXIT_BOOTSTRAP_FAILED
from tests.unit.fake_imds import FakeImds
from tests.unit.test_bootstrap import (  # the bootstrap's own fixtures: a moto server and an event bus
    INSTANCE_ID,
    Bus,
    a_document,
    bus,
    run_bootstrap,
)

__all__ = ["bus"]  # fixtures, re-exported for pytest


def a_command(tmp_path: Path, case: str) -> list[str]:
    if case == "not-found":
        return [str(tmp_path / "no-such-python"), "train.py"]
    script = tmp_path / "train.sh"  # there, but without the execute bit
    script.write_text("#!/bin/sh\necho never\n")
    script.chmod(0o644)
    return [str(script)]


@pytest.mark.parametrize(
    "case",
    [("not-found", 127, "No such file or directory"), ("not-executable", 126, "Permission denied")],
    ids=["not-found", "not-executable"],
)
def test_a_command_that_cannot_start_is_reported_as_the_workloads_exit(
    tmp_path: Path, bus: Bus, moto_endpoint: str, case: tuple[str, int, str]
) -> None:
    kind, code, words = case
    argv = a_command(tmp_path, kind)
    document = a_document(tmp_path, bus, command=argv)
    with FakeImds(user_data=json.dumps(document.model_dump(mode="json")).encode(), instance_id=INSTANCE_ID) as imds:
        exit_code, output = run_bootstrap(tmp_path, imds, moto_endpoint, "--no-shutdown")

    assert exit_code == code != EXIT_BOOTSTRAP_FAILED, output
    [exited] = bus.exits()
    assert (exited["exit_code"], exited["reason"]) == (code, "exited")
    assert exited["message"] == f"workload exited with {code}: {argv[0]}: {words}"
