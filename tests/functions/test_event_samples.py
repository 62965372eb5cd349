"""Every sample under events/ is a real event the function handles (also usable with `sam local invoke -e`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job_ids import job_id_for
from gpujobs_local.stack import LambdaContext, MotoStack, load_function

pytestmark = pytest.mark.integration
EVENTS = Path(__file__).resolve().parents[2] / "events" / "submit"


def replay(stack: MotoStack, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    event = json.loads((EVENTS / name).read_text())
    return event, load_function("submit").handler(event, LambdaContext())


def test_the_job_spec_sample_launches_its_job(stack: MotoStack) -> None:
    event, response = replay(stack, "job-spec.json")

    assert response == {"batchItemFailures": []}
    spec = json.loads(event["Records"][0]["body"])
    job_id = job_id_for(client_token=spec["client_token"], team=spec["team"], message_id=None)
    job = DynamoJobStore(table_name=stack.table, client=stack.ddb).get(job_id)
    assert job.state.value == "RUNNING"
    assert len(stack.instances(**{"gpujobs:job-id": job_id})) == 1


def test_the_invalid_spec_sample_is_rejected_with_every_problem(stack: MotoStack) -> None:
    event, response = replay(stack, "invalid-spec.json")

    assert response == {"batchItemFailures": []}
    job_id = job_id_for(client_token=None, team=None, message_id=event["Records"][0]["messageId"])
    job = DynamoJobStore(table_name=stack.table, client=stack.ddb).get(job_id)
    assert job.state.value == "REJECTED"
    assert {p.split(":")[0] for p in job.problems} == {"name", "image", "command", "nodes"}


def test_the_cancel_sample_for_an_unknown_job_is_consumed(stack: MotoStack) -> None:
    _, response = replay(stack, "cancel.json")
    assert response == {"batchItemFailures": []}


def test_the_mixed_batch_sample_launches_two_jobs_and_rejects_one(stack: MotoStack) -> None:
    _, response = replay(stack, "mixed-batch.json")

    assert response == {"batchItemFailures": []}
    assert len(stack.instances()) == 3
    store = DynamoJobStore(table_name=stack.table, client=stack.ddb)
    from gpujobs.domain.states import JobState

    assert len(store.list_by_state(JobState.REJECTED)) == 1
    assert len(store.list_by_state(JobState.RUNNING)) == 2
