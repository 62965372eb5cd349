"""`gpujobs local tour` tells a true story: this checks what its summary claims."""

from __future__ import annotations

import json

import pytest

from gpujobs_local.tour import main

pytestmark = pytest.mark.integration


def test_the_tour_launches_falls_back_deduplicates_rejects_and_cancels(
    aws_credentials: None, restored_environ: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--json"]) == 0

    summary = json.loads(capsys.readouterr().out)
    jobs = summary["jobs"]
    assert jobs["digits"]["state"] == "RUNNING"
    assert jobs["digits"]["instances"] == 1
    assert jobs["gang"]["instance_type"] == "g6.xlarge"
    assert jobs["gang"]["refused_tries"] == 2
    assert jobs["gang"]["instances"] == 2
    assert jobs["gang"]["after_cancel"] == {"state": "CANCELLED", "instances": 0}
    assert jobs["duplicate"]["instances"] == 1
    assert [p.split(":")[0] for p in jobs["rejected"]["problems"]] == ["name", "command", "nodes", "instance_types"]
    assert jobs["digits"]["after_warning"] == {
        "state": "RUNNING",
        "interruptions": 1,
        "replacement_zone": "us-east-1b",
        "replacement_attempt": 2,
    }
    assert summary["state_change_events"] == 14
