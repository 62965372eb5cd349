"""What the previous release wrote is still read, acted on and written back by this one.

The fixtures under tests/fixtures/previous_release/ were written by the previous release's own code
(`generate.py` there says how, `MANIFEST.json` from which commit): a job record in each state as its
store wrote them to DynamoDB, each report one of its running instances sends, and the run document
its launches put in user data. During an upgrade these meet this release's handlers; after a
rollback the previous release meets this one's records, so a newer record's fields must survive a
write by an older release (here: a record with fields this release does not know).

Two of the fixture jobs' specs were valid when submitted and are refused at submit today (an
`s3://` code archive without `code_sha256`, an env value with a line break): before records were
read as stored records, every one of those jobs was unreadable after the upgrade.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore, job_of_item, schema_version_of
from gpujobs.adapters.inbound import detail_of, envelope
from gpujobs.adapters.inbound_reports import REPORT_MODELS
from gpujobs.domain.effects import Outcome
from gpujobs.domain.records import RECORD_SCHEMA_VERSION
from gpujobs.domain.rundoc import RunDocument
from gpujobs.domain.spec import SpecError, validate_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs.instance.rundoc import load_document
from gpujobs.instance.userdata import parse_user_data
from gpujobs.service.ports import UnreadableJobError
from gpujobs_local.template import table_definition
from tests.service.conftest import World

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())
TABLE = "jobs"


def fixture(*parts: str) -> Any:
    return json.loads(FIXTURES.joinpath(*parts).with_suffix(".json").read_text())


def record(state: JobState) -> dict[str, Any]:
    item: dict[str, Any] = fixture("records", state.value)
    return item


@pytest.fixture
def store(aws_credentials: None) -> Iterator[DynamoJobStore]:
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        ddb.create_table(**table_definition(table_name=TABLE))
        yield DynamoJobStore(table_name=TABLE, client=ddb)


def put_raw(store: DynamoJobStore, item: dict[str, Any]) -> None:
    boto3.client("dynamodb", region_name="us-east-1").put_item(TableName=TABLE, Item=item)


def raw_item(job_id: str) -> dict[str, Any]:
    client = boto3.client("dynamodb", region_name="us-east-1")
    item: dict[str, Any] = client.get_item(TableName=TABLE, Key={"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "JOB"}})[
        "Item"
    ]
    return item


def test_the_fixtures_come_from_a_commit_of_this_repository() -> None:
    assert len(MANIFEST["commit"]) == 40
    assert MANIFEST["generated_by"] == "tests/fixtures/previous_release/generate.py"
    assert sorted(p.stem for p in (FIXTURES / "records").glob("*.json")) == sorted(s.value for s in JobState)


@pytest.mark.parametrize("state", list(JobState), ids=lambda s: s.value)
def test_a_record_in_each_state_is_read_and_written_back(store: DynamoJobStore, state: JobState) -> None:
    item = record(state)
    assert "schema_version" not in item  # the previous release stamped none: it reads as version 1
    put_raw(store, item)
    job_id = item["job_id"]["S"]

    read = store.get(job_id)
    saved = store.save(read.model_copy(update={"status_detail": "read by the next release"}))

    assert read.state is state
    assert read.version == int(item["version"]["N"])
    assert schema_version_of(item) == 1
    assert schema_version_of(raw_item(job_id)) == RECORD_SCHEMA_VERSION
    again = store.get(job_id)
    assert again == saved
    assert again.model_copy(update={"status_detail": read.status_detail, "version": read.version}) == read


def test_a_spec_accepted_then_and_refused_at_submit_now_is_still_read(store: DynamoJobStore) -> None:
    item = record(JobState.RUNNING)
    put_raw(store, item)
    spec = store.get(item["job_id"]["S"]).require_spec()

    assert spec.code == "s3://team-code/digits/code.tar.gz"
    assert spec.code_sha256 is None
    assert spec.env["BANNER"] == "line one\nline two"
    resubmitted = spec.model_dump(mode="json", exclude_none=True)
    with pytest.raises(SpecError, match="line break"):  # a new submission of the same spec is refused
        validate_spec(resubmitted)
    with pytest.raises(SpecError, match="code_sha256: required"):
        validate_spec(resubmitted | {"env": {}})


def newer(item: dict[str, Any]) -> dict[str, Any]:
    """`item` as a newer release would write it: fields this release has no name for, at every depth."""
    doc = json.loads(item["doc"]["S"])
    doc["priority"] = {"class": "high", "since": "2026-12-01T00:00:00Z"}
    doc["spec"]["preemptible_after_hours"] = 6
    doc["spec"]["idle"]["grace_minutes"] = 10
    doc["attempts"][0]["capacity_reservation_id"] = "cr-0123"
    doc["attempts"][0]["tries"][0]["retry_after_seconds"] = 30
    doc["history"][-1]["actor"] = "reconciler"
    return {**item, "doc": {"S": json.dumps(doc)}, "schema_version": {"N": str(RECORD_SCHEMA_VERSION + 1)}}


def test_a_newer_releases_fields_survive_a_read_modify_write_by_this_release(store: DynamoJobStore) -> None:
    item = newer(record(JobState.RUNNING))
    put_raw(store, item)
    job = store.get(item["job_id"]["S"])
    now = datetime.fromisoformat(MANIFEST["signed_at"])

    attempt = job.attempts[0].model_copy(update={"interrupted_at": now})
    store.save(job.with_attempt(attempt, now=now).transition(JobState.INTERRUPTED, Reason.SPOT_INTERRUPTION, now=now))

    written = raw_item(job.job_id)
    doc = json.loads(written["doc"]["S"])
    assert doc["state"] == "INTERRUPTED"
    assert doc["priority"] == {"class": "high", "since": "2026-12-01T00:00:00Z"}
    assert doc["spec"]["preemptible_after_hours"] == 6
    assert doc["spec"]["idle"]["grace_minutes"] == 10
    assert doc["attempts"][0]["capacity_reservation_id"] == "cr-0123"
    assert doc["attempts"][0]["interrupted_at"] is not None
    assert doc["attempts"][0]["tries"][0]["retry_after_seconds"] == 30
    assert doc["history"][-2]["actor"] == "reconciler"  # the newer entry; this release's own has no actor
    assert "actor" not in doc["history"][-1]
    assert schema_version_of(written) == RECORD_SCHEMA_VERSION  # the schema of the release that wrote it last


def test_a_submission_still_refuses_a_field_the_spec_does_not_have() -> None:
    spec = json.loads(record(JobState.QUEUED)["doc"]["S"])["spec"] | {"gpu_per_node": 2}

    with pytest.raises(SpecError, match="gpu_per_node: unknown field"):
        validate_spec(spec | {"code_sha256": "0" * 64})


def test_an_item_this_release_cannot_read_is_skipped_by_a_listing_and_named(store: DynamoJobStore) -> None:
    readable, broken = record(JobState.RUNNING), newer(record(JobState.RUNNING))
    doc = json.loads(broken["doc"]["S"])
    doc["job_id"] = "j-00000000000000ff"
    doc["history"][-1]["reason"] = "first-heartbeat-overdue"  # a reason a newer release added
    broken = {
        **broken,
        "pk": {"S": "JOB#j-00000000000000ff"},
        "job_id": {"S": "j-00000000000000ff"},
        "doc": {"S": json.dumps(doc)},
    }
    put_raw(store, readable)
    put_raw(store, broken)
    skipped: list[UnreadableJobError] = []

    listed = store.list_by_state(JobState.RUNNING, on_unreadable=skipped.append)

    assert [j.job_id for j in listed] == [readable["job_id"]["S"]]
    assert [e.job_id for e in skipped] == ["j-00000000000000ff"]
    assert skipped[0].problem.startswith("history.2.reason: Input should be")
    with pytest.raises(UnreadableJobError, match="j-00000000000000ff"):
        store.get("j-00000000000000ff")
    with pytest.raises(UnreadableJobError):
        store.list_by_state(JobState.RUNNING)


def delivered(world: World, kind: str) -> Outcome:
    """The fixture event through the reports function's own parsing, then its service."""
    event = envelope(fixture("reports", kind))
    model = REPORT_MODELS[event.detail_type]
    return world.reports.receive(detail_of(event, model).signed()).outcome


def test_each_report_of_a_running_previous_release_instance_is_verified_and_acted_on() -> None:
    world = World()
    assert world.ports.report_keys.secret == MANIFEST["stack_secret"].encode()  # type: ignore[attr-defined]
    item = record(JobState.RUNNING)
    job = world.store.create(job_of_item(item))
    world.clock.current = datetime.fromisoformat(MANIFEST["signed_at"])

    outcomes = [delivered(world, kind) for kind in ("heartbeat", "checkpoint_committed", "job_exited")]

    assert Outcome.UNPROVEN_REPORT not in outcomes
    after = world.store.get(job.job_id)
    attempt = after.attempts[0]
    assert attempt.heartbeat_step == 450
    assert after.checkpoint_step == 400
    assert attempt.exit_codes == {MANIFEST["instance_id"]: 0}
    assert after.state is JobState.SUCCEEDED


def test_the_run_document_of_a_previous_release_launch_reads_on_both_sides() -> None:
    document = fixture("run_document")
    user_data = json.dumps(document).encode()

    on_the_instance = load_document(user_data, s3=lambda: None, partial={})
    at_the_launcher = parse_user_data(user_data)

    assert on_the_instance["job_id"] == document["job_id"]
    assert on_the_instance["checkpoint_key"] == ""  # a field added since: its default
    assert isinstance(at_the_launcher, RunDocument)
    assert at_the_launcher.report_key == document["report_key"]
