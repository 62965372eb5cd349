"""Every sample under events/ replayed through its real handler against a running job on moto.

The samples name a placeholder instance (i-0abc1234def567890), job (j-0123456789abcdef) and stack
(gpujobs); the replay swaps in the job that was just launched, as `sam local invoke -e` users would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.budget import BudgetMode
from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from gpujobs_local.stack import STACK, LambdaContext, MotoStack, load_function

pytestmark = pytest.mark.integration
EVENTS = Path(__file__).resolve().parents[2] / "events"
SPEC = {
    "name": "digits",
    "image": "r/train:1",
    "command": ["python", "t.py"],
    "instance_types": ["g5.xlarge"],
    "team": "vision",
}


def replay(stack: MotoStack, sample: str, job: Job) -> None:
    (iid,) = job.instance_ids
    text = (EVENTS / sample).read_text()
    text = text.replace("i-0abc1234def567890", iid).replace("j-0123456789abcdef", job.job_id)
    text = text.replace("gpujobs-idle-gpujobs-", f"gpujobs-idle-{STACK}-").replace(
        "gpujobs-gpujobs-", f"gpujobs-{STACK}-"
    )
    event = json.loads(text)
    folder = sample.split("/", maxsplit=1)[0]
    if folder == "reports":  # sent by the job's instance, which signs with its attempt's key
        event["detail"] = stack.signed_by(iid, event["detail-type"], event["detail"])
    load_function(folder).handler(event, LambdaContext())


def now_running(stack: MotoStack) -> Job:
    stack.send(SPEC)
    stack.deliver(load_function("submit").handler)
    (job,) = DynamoJobStore(table_name=stack.table, client=stack.ddb).list_by_state(JobState.RUNNING)
    return job


Check = Callable[[MotoStack, Job, Job], None]


def interrupted_and_replaced(stack: MotoStack, before: Job, after: Job) -> None:
    assert after.interruptions == 1
    assert after.current_attempt is not None
    assert after.current_attempt.number == 2
    assert len(stack.ssm.list_commands()["Commands"]) == 1


def checkpoint_requested_only(stack: MotoStack, before: Job, after: Job) -> None:
    assert len(stack.ssm.list_commands()["Commands"]) == 1
    assert after.current_attempt == before.current_attempt.model_copy(  # type: ignore[union-attr]
        update={"checkpoint_signalled_at": after.current_attempt.checkpoint_signalled_at}  # type: ignore[union-attr]
    )


def recorded_gone(stack: MotoStack, before: Job, after: Job) -> None:
    assert after.current_attempt is not None
    assert after.current_attempt.gone == before.instance_ids
    assert after.state is JobState.RUNNING  # waits for a report (or the grace) before judging


def unchanged(stack: MotoStack, before: Job, after: Job) -> None:
    assert after.version == before.version


def checkpoint_recorded(stack: MotoStack, before: Job, after: Job) -> None:
    assert after.checkpoint_step == 1200


def heartbeat_recorded(stack: MotoStack, before: Job, after: Job) -> None:
    assert after.current_attempt is not None
    assert after.current_attempt.heartbeat_step is not None


def succeeded(stack: MotoStack, before: Job, after: Job) -> None:
    assert after.state is JobState.SUCCEEDED


def stop_requested(stack: MotoStack, before: Job, after: Job) -> None:
    assert after.stop_request is not None
    assert len(stack.instances()) == 1  # the checkpoint comes first


def held(stack: MotoStack, before: Job, after: Job) -> None:
    stop_requested(stack, before, after)
    book = __import__("gpujobs.adapters.budgets", fromlist=["DynamoBudgetBook"]).DynamoBudgetBook
    assert book(table_name=stack.table, client=stack.ddb).policy_for("vision").mode is BudgetMode.HOLD


def spot_only(stack: MotoStack, before: Job, after: Job) -> None:
    book = __import__("gpujobs.adapters.budgets", fromlist=["DynamoBudgetBook"]).DynamoBudgetBook
    assert book(table_name=stack.table, client=stack.ddb).policy_for("vision").mode is BudgetMode.SPOT_ONLY
    assert after.stop_request is None


SAMPLES: dict[str, Check] = {
    "spot/interruption-warning.json": interrupted_and_replaced,
    "spot/rebalance-recommendation.json": checkpoint_requested_only,
    "instance_state/terminated.json": recorded_gone,
    "instance_state/shutting-down.json": recorded_gone,
    "instance_state/stopped.json": recorded_gone,
    "instance_state/running.json": unchanged,
    "reports/checkpoint-committed.json": checkpoint_recorded,
    "reports/heartbeat.json": heartbeat_recorded,
    "reports/job-exited.json": succeeded,
    "reports/job-exited-instance.json": succeeded,
    "idle/gpu-idle-alarm.json": stop_requested,
    "budget/actual-breach-sns.json": held,
    "budget/forecast-breach-sns.json": spot_only,
    "budget/cost-anomaly.json": spot_only,
    "budget/unparseable-sns.json": unchanged,
    "reconciler/scheduled.json": unchanged,
}


def test_every_sample_has_a_replay() -> None:
    on_disk = {str(p.relative_to(EVENTS)) for p in EVENTS.glob("*/*.json") if p.parent.name != "submit"}
    assert on_disk == set(SAMPLES)


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_replaying_the_sample_has_its_documented_outcome(stack: MotoStack, sample: str) -> None:
    job = now_running(stack)

    replay(stack, sample, job)

    after = DynamoJobStore(table_name=stack.table, client=stack.ddb).get(job.job_id)
    SAMPLES[sample](stack, job, after)


@pytest.mark.parametrize(
    "sample", ["spot/interruption-warning.json", "reports/job-exited.json", "idle/gpu-idle-alarm.json"]
)
def test_replaying_the_sample_twice_changes_nothing_more(stack: MotoStack, sample: str) -> None:
    job = now_running(stack)
    replay(stack, sample, job)
    store = DynamoJobStore(table_name=stack.table, client=stack.ddb)
    once = store.get(job.job_id)
    instances_once = sorted(i["InstanceId"] for i in stack.instances())
    commands_once = len(stack.ssm.list_commands()["Commands"])

    replay(stack, sample, job)

    assert store.get(job.job_id).version == once.version
    assert sorted(i["InstanceId"] for i in stack.instances()) == instances_once
    assert len(stack.ssm.list_commands()["Commands"]) == commands_once
