"""The event handlers on moto: a spot warning, a job's end, an idle GPU, a budget, the reconciler.

The stack is built from template.yaml; EC2, SSM, CloudWatch and DynamoDB are moto's; the events are
what EventBridge (or SNS) would hand each function.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Job
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState
from gpujobs_local.stack import STACK, LambdaContext, MotoStack, load_function

pytestmark = pytest.mark.integration

SPEC: dict[str, Any] = {
    "name": "digits",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge", "g6.xlarge"],
    "team": "vision",
}


def launched(stack: MotoStack, **overrides: Any) -> Job:
    stack.send({**SPEC, **overrides})
    stack.deliver(load_function("submit").handler)
    (job,) = DynamoJobStore(table_name=stack.table, client=stack.ddb).list_by_state(JobState.RUNNING)
    return job


def store(stack: MotoStack) -> DynamoJobStore:
    return DynamoJobStore(table_name=stack.table, client=stack.ddb)


def invoke(name: str, event: dict[str, Any]) -> Any:
    return load_function(name).handler(event, LambdaContext())


def test_a_spot_warning_signals_a_checkpoint_and_launches_a_replacement_in_another_zone(stack: MotoStack) -> None:
    job = launched(stack)
    (old,) = job.instance_ids

    invoke(
        "spot",
        stack.eventbridge(
            "aws.ec2", "EC2 Spot Instance Interruption Warning", {"instance-id": old, "instance-action": "terminate"}
        ),
    )

    (command,) = stack.ssm.list_commands()["Commands"]
    assert command["DocumentName"] == stack.checkpoint_document
    assert command["Parameters"]["containerName"] == [f"gpujobs-{job.job_id}-a1"]
    assert command["InstanceIds"] == [old]
    replacement = stack.instances(**{"gpujobs:attempt": "2"})
    assert len(replacement) == 1
    assert replacement[0]["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert store(stack).get(job.job_id).state is JobState.RUNNING


def test_exit_reports_and_state_changes_succeed_the_job_and_delete_its_alarms(stack: MotoStack) -> None:
    job = launched(stack)
    (iid,) = job.instance_ids
    cw = __import__("boto3").client("cloudwatch", region_name="us-east-1")
    assert [a["AlarmName"] for a in cw.describe_alarms()["MetricAlarms"]] == [f"gpujobs-idle-{STACK}-{iid}"]

    invoke(
        "instance_state",
        stack.eventbridge(
            "aws.ec2", "EC2 Instance State-change Notification", {"instance-id": iid, "state": "terminated"}
        ),
    )
    invoke(
        "reports",
        stack.eventbridge(
            "gpujobs.instance",
            "Job Exited",
            stack.signed_by(
                iid,
                "Job Exited",
                {
                    "job_id": job.job_id,
                    "attempt": 1,
                    "node_rank": 0,
                    "instance_id": iid,
                    "exit_code": 0,
                    "reason": "exited",
                    "message": "",
                },
            ),
        ),
    )

    assert store(stack).get(job.job_id).state is JobState.SUCCEEDED
    assert cw.describe_alarms()["MetricAlarms"] == []


def test_an_idle_alarm_checkpoints_then_terminates_the_spot_instance_and_stops_the_job(stack: MotoStack) -> None:
    job = launched(stack)
    (iid,) = job.instance_ids
    alarm = {
        "alarmName": f"gpujobs-idle-{STACK}-{iid}",
        "state": {"value": "ALARM", "reason": "Threshold Crossed", "timestamp": "2026-11-29T12:05:00.000+0000"},
        "previousState": {"value": "OK", "reason": "", "timestamp": "2026-11-29T11:50:00.000+0000"},
        "configuration": {
            "metrics": [
                {
                    "id": "m1",
                    "metricStat": {
                        "metric": {
                            "namespace": "CWAgent",
                            "name": "nvidia_smi_utilization_gpu",
                            "dimensions": {"InstanceId": iid},
                        },
                        "period": 60,
                        "stat": "Average",
                    },
                    "returnData": True,
                }
            ]
        },
    }

    invoke("idle", stack.eventbridge("aws.cloudwatch", "CloudWatch Alarm State Change", alarm))
    assert len(stack.instances()) == 1  # nothing stops before the checkpoint is safe
    invoke(
        "reports",
        stack.eventbridge(
            "gpujobs.trainer",
            "Checkpoint Committed",
            stack.signed_by(
                iid,
                "Checkpoint Committed",
                {
                    "job_id": job.job_id,
                    "attempt": 1,
                    "step": 300,
                    "uri": f"s3://{stack.bucket}/jobs/{job.job_id}/ckpt/step-00000300",
                    "reason": "on-demand",
                },
            ),
        ),
    )
    assert stack.instances() == []
    invoke(
        "instance_state",
        stack.eventbridge(
            "aws.ec2", "EC2 Instance State-change Notification", {"instance-id": iid, "state": "terminated"}
        ),
    )

    stopped = store(stack).get(job.job_id)
    assert stopped.state is JobState.STOPPED
    assert stopped.checkpoint_step == 300


def test_the_reconciler_repairs_a_lost_state_change(stack: MotoStack) -> None:
    job = launched(stack, capacity="on-demand")
    (iid,) = job.instance_ids
    stack.ec2.terminate_instances(InstanceIds=[iid])  # no event reaches the control plane

    result = invoke("reconciler", {"source": "aws.scheduler"})

    assert result["repairs"]["lost state changes repaired"] == 1
    assert store(stack).get(job.job_id).current_attempt.gone == (iid,)  # type: ignore[union-attr]


class NearlyTimedOut(LambdaContext):
    def get_remaining_time_in_millis(self) -> int:
        return 10_000


def test_the_reconciler_leaves_launch_work_to_the_next_run_when_its_own_time_is_nearly_up(stack: MotoStack) -> None:
    queued = Job.submitted(job_id="j-queued", spec=validate_spec(SPEC), now=datetime.now(UTC), message_id="m-1")
    store(stack).create(queued)  # due a launch, as after a capacity refusal whose retry time has come

    late = load_function("reconciler").handler({"source": "aws.scheduler"}, NearlyTimedOut())
    assert late["repairs"]["launches deferred to the next run"] == 1
    assert store(stack).get("j-queued").state is JobState.QUEUED
    on_time = invoke("reconciler", {"source": "aws.scheduler"})

    assert on_time["repairs"]["queued jobs retried"] == 1
    assert store(stack).get("j-queued").state is JobState.RUNNING


def test_an_actual_budget_breach_over_sns_holds_launches(stack: MotoStack) -> None:
    message = (
        "AWS Budget Notification November 29, 2026\nAWS Account 123456789012\n\n"
        f"Budget Name: gpujobs-{STACK}-all\nBudget Type: Cost\nBudgeted Amount: $1,000.00\n"
        "Alert Type: ACTUAL\nAlert Threshold: > $1,000.00\nACTUAL Amount: $1,042.17\n"
    )
    sns = {
        "Records": [
            {
                "EventSource": "aws:sns",
                "EventVersion": "1.0",
                "EventSubscriptionArn": "arn:x",
                "Sns": {
                    "Type": "Notification",
                    "MessageId": "m-1",
                    "TopicArn": "arn:aws:sns:us-east-1:1:t",
                    "Subject": f"AWS Budgets: gpujobs-{STACK}-all has exceeded your alert threshold",
                    "Message": message,
                    "Timestamp": "2026-11-29T12:00:00.000Z",
                },
            }
        ]
    }

    invoke("budget", sns)
    stack.send(SPEC)
    stack.deliver(load_function("submit").handler)

    (held,) = store(stack).list_by_state(JobState.QUEUED)
    assert held.hold_reason is not None
    assert "ACTUAL $1,042.17" in held.hold_reason
    assert stack.instances() == []
