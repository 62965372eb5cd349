"""Bad input is always consumed, never retried: hostile bodies through the real submit handler on moto.

Every body below fits in an SQS message. A body that made the handler raise would come back after its
visibility timeout and, after maxReceiveCount tries, sit in the dead-letter queue while its sender is
told nothing. Each must instead end as a REJECTED record, under its own message's id, whose problems
and echo of the input are bounded (a record past DynamoDB's item limit would fail the write, and so
the message), and which never repeats a credential it was sent.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpujobs.domain.job_ids import job_id_for
from gpujobs.domain.spec_errors import MAX_PROBLEM_CHARS, MAX_PROBLEMS
from gpujobs.domain.states import JobState
from gpujobs_local.stack import MotoStack
from tests.conftest import load_function
from tests.unit.test_spec_corpus import BASE, HOSTILE

pytestmark = pytest.mark.integration

SQS_MAX_BODY = 1024 * 1024
CREDENTIAL = "hf_" + "Leaked0Token" * 3
BODIES: dict[str, str] = {
    **{case: str(document) for case, document, _ in HOSTILE},
    "twenty-thousand-unknown-fields": json.dumps({**BASE, **{f"u{i}": 0 for i in range(20_000)}}),
    "a-whole-sqs-message": json.dumps({**BASE, "env": {"PAD": "x" * (SQS_MAX_BODY - 1024)}}),
    "credential-in-env": json.dumps({**BASE, "env": {"HF_TOKEN": CREDENTIAL}}),
    "cancel-with-a-huge-id": json.dumps({"cancel_job_id": "j-" + "0" * 5000}),
    "cancel-with-a-mapping": json.dumps({"cancel_job_id": {"$ne": ""}}),
}


@pytest.fixture
def submit() -> Any:
    return load_function("submit").handler


def test_every_hostile_body_is_consumed_and_recorded_rejected_with_a_bounded_record(
    stack: MotoStack, submit: Any
) -> None:
    assert all(len(body.encode()) <= SQS_MAX_BODY for body in BODIES.values())
    sent = {stack.send(body): case for case, body in BODIES.items()}

    responses = stack.deliver(submit, rounds=len(BODIES))

    assert all(r == {"batchItemFailures": []} for r in responses), responses
    assert stack.deliver(submit) == [], "nothing is left to retry"
    assert stack.dead_letters() == []
    assert stack.instances() == []
    for message_id, case in sent.items():
        key = {"pk": {"S": f"JOB#{job_id_for(client_token=None, team=None, message_id=message_id)}"}}
        item = stack.ddb.get_item(TableName=stack.table, Key={**key, "sk": {"S": "JOB"}}).get("Item")
        assert item is not None, f"{case}: no record"
        doc = item["doc"]["S"]
        job = json.loads(doc)
        assert job["state"] == JobState.REJECTED.value, case
        assert 1 <= len(job["problems"]) <= MAX_PROBLEMS + 1, case
        assert all(len(p) <= MAX_PROBLEM_CHARS and p.isprintable() for p in job["problems"]), case
        assert len(job["submission_excerpt"]) <= 1024, case
        assert len(doc.encode()) < 32 * 1024, f"{case}: a {len(doc)}-byte record"
        assert CREDENTIAL not in doc, f"{case}: the record repeats a credential"
