"""The real handlers on moto, fed what one team's job (or another stack) can put on a bus.

Each attack worked before: a report naming another job was acted on whoever sent it, and the idle
function acted on any alarm naming one of our instances. Now the reports function verifies each
report with the key derived from the stack's report secret (in moto's Secrets Manager), and every
handler ignores, counts and consumes what is forged, foreign or malformed: nothing raises (so
nothing is retried into the dead-letter queue) and nothing changes.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from gpujobs_local.stack import STACK, LambdaContext, MotoStack, load_function

pytestmark = pytest.mark.integration

SPEC: dict[str, Any] = {
    "name": "digits",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge"],
}


def launched(stack: MotoStack, team: str) -> Job:
    stack.send({**SPEC, "team": team, "client_token": team})
    stack.deliver(load_function("submit").handler)
    jobs = DynamoJobStore(table_name=stack.table, client=stack.ddb).list_by_state(JobState.RUNNING)
    (job,) = [j for j in jobs if j.team == team]
    return job


def stored(stack: MotoStack, job: Job) -> Job:
    return DynamoJobStore(table_name=stack.table, client=stack.ddb).get(job.job_id)


def invoke(name: str, event: dict[str, Any]) -> None:
    load_function(name).handler(event, LambdaContext())


def exit_of(job: Job, code: int) -> dict[str, Any]:
    (iid,) = job.instance_ids
    return {"job_id": job.job_id, "attempt": 1, "node_rank": 0, "instance_id": iid, "exit_code": code, "reason": "x"}


def idle_alarm(name: str, instance_id: str) -> dict[str, Any]:
    metric = {"namespace": "CWAgent", "name": "nvidia_smi_utilization_gpu", "dimensions": {"InstanceId": instance_id}}
    return {
        "alarmName": name,
        "state": {"value": "ALARM"},
        "configuration": {"metrics": [{"metricStat": {"metric": metric}}]},
    }


def test_another_jobs_forged_exit_neither_fails_nor_succeeds_the_victim(stack: MotoStack) -> None:
    victim, attacker = launched(stack, "vision"), launched(stack, "speech")
    (attacker_instance,) = attacker.instance_ids

    for detail in (
        exit_of(victim, 1),  # unsigned, as any job could send it
        stack.signed_by(attacker_instance, "Job Exited", exit_of(victim, 0)),  # with the key it does hold
    ):
        invoke("reports", stack.eventbridge("gpujobs.instance", "Job Exited", detail))

    assert stored(stack, victim).state is JobState.RUNNING
    assert stored(stack, victim).current_attempt.exit_codes == {}  # type: ignore[union-attr]
    assert len(stack.instances()) == 2


def test_the_victims_own_signed_exit_still_ends_its_job(stack: MotoStack) -> None:
    job = launched(stack, "vision")
    (iid,) = job.instance_ids

    invoke(
        "reports",
        stack.eventbridge("gpujobs.instance", "Job Exited", stack.signed_by(iid, "Job Exited", exit_of(job, 0))),
    )

    assert stored(stack, job).current_attempt.exit_codes == {iid: 0}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "detail",
    [
        {"job_id": "../../etc", "attempt": 1, "step": 5},
        {"job_id": "j-0123456789abcdef", "attempt": "one", "step": 5},
        {"job_id": None, "attempt": None, "step": 5},
        {"job_id": "j-0123456789abcdef", "attempt": 1, "step": 5, "signed_at": 1, "signature": "x" * 10_000},
    ],
    ids=["path-like-job-id", "text-attempt", "nulls", "oversized-signature"],
)
def test_a_malformed_report_is_consumed_without_a_retry(stack: MotoStack, detail: dict[str, Any]) -> None:
    job = launched(stack, "vision")

    invoke("reports", stack.eventbridge("gpujobs.trainer", "Training Heartbeat", detail))

    assert stored(stack, job).version == job.version


def test_another_stacks_idle_alarm_naming_our_instance_stops_nothing(stack: MotoStack) -> None:
    job = launched(stack, "vision")
    (iid,) = job.instance_ids

    for name in (f"gpujobs-idle-{STACK}-staging-{iid}", f"gpujobs-idle-{STACK}-i-0000000000000000a", "gpujobs-idle-x"):
        invoke("idle", stack.eventbridge("aws.cloudwatch", "CloudWatch Alarm State Change", idle_alarm(name, iid)))

    assert stored(stack, job).stop_request is None
    assert stack.ssm.list_commands()["Commands"] == []


def test_our_own_idle_alarm_still_asks_for_a_checkpoint_first(stack: MotoStack) -> None:
    job = launched(stack, "vision")
    (iid,) = job.instance_ids

    name = f"gpujobs-idle-{STACK}-{iid}"
    invoke("idle", stack.eventbridge("aws.cloudwatch", "CloudWatch Alarm State Change", idle_alarm(name, iid)))

    assert stored(stack, job).stop_request is not None


@pytest.mark.parametrize("instance_id", ["i-XYZ", "i-0abc; rm -rf /", "", "i-" + "0" * 40])
def test_ec2_events_naming_a_malformed_instance_id_are_ignored(stack: MotoStack, instance_id: str) -> None:
    job = launched(stack, "vision")

    invoke(
        "spot",
        stack.eventbridge(
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            {"instance-id": instance_id, "instance-action": "terminate"},
        ),
    )
    invoke(
        "instance_state",
        stack.eventbridge(
            "aws.ec2", "EC2 Instance State-change Notification", {"instance-id": instance_id, "state": "terminated"}
        ),
    )

    assert stored(stack, job).version == job.version
    assert stack.ssm.list_commands()["Commands"] == []
