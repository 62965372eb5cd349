"""The small AWS adapters against moto: the calls they make and what AWS then holds.

Stories: idle alarms are created on the CloudWatch agent's per-instance GPU series and removed
again; "checkpoint now" sends the stack's command document with the container name; budget
policies resolve to the strictest of the team and "all"; the stack's instances are listed with
their job and attempt and an on-demand one can be stopped; prices come from the packaged table and
EC2's spot price history. moto gaps that matter here (contracts §4): spot prices are all 0.00001,
describe_spot_price_history ignores AvailabilityZone and MaxResults, send_command always
"succeeds", and a one-time spot instance can be stopped (AWS refuses).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from gpujobs.adapters.budgets import DynamoBudgetBook
from gpujobs.adapters.cloudwatch import CloudWatchIdleAlarms
from gpujobs.adapters.ec2 import Ec2Compute
from gpujobs.adapters.prices import Ec2Prices
from gpujobs.adapters.ssm import SsmSignaller
from gpujobs.contract import ATTEMPT_TAG as TAG_ATTEMPT
from gpujobs.contract import JOB_TAG as TAG_JOB
from gpujobs.contract import STACK_TAG as TAG_STACK
from gpujobs.contract import idle_alarm_name as alarm_name
from gpujobs.domain.budget import BudgetMode, BudgetPolicy
from gpujobs.domain.job import Market
from gpujobs_local.template import parameter_default, properties, table_definition

pytestmark = pytest.mark.integration

REGION = "us-east-1"
STACK = "gpujobs-test"
AMI = "ami-12c6146b"


@pytest.fixture
def aws(aws_credentials: None) -> Iterator[None]:
    with mock_aws():
        yield


def client(service: str) -> Any:
    return boto3.client(service, region_name=REGION)


# --- GPU-idle alarms ------------------------------------------------------------------------------


def test_each_instance_gets_an_idle_alarm_on_its_own_gpu_series_and_nothing_else(aws: None) -> None:
    cloudwatch = client("cloudwatch")
    alarms = CloudWatchIdleAlarms(client=cloudwatch, stack_name=STACK)

    alarms.create(job_id="j-1", instance_ids=["i-0aaa", "i-0bbb"], below_percent=5, minutes=15)

    found = {a["AlarmName"]: a for a in cloudwatch.describe_alarms(AlarmNamePrefix="gpujobs-idle-")["MetricAlarms"]}
    assert sorted(found) == [f"gpujobs-idle-{STACK}-i-0aaa", f"gpujobs-idle-{STACK}-i-0bbb"]
    alarm = found[alarm_name(STACK, "i-0aaa")]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("CWAgent", "nvidia_smi_utilization_gpu")
    assert alarm["Dimensions"] == [{"Name": "InstanceId", "Value": "i-0aaa"}]
    assert alarm["ComparisonOperator"] == "LessThanThreshold"
    assert alarm["Threshold"] == 5.0
    assert alarm["EvaluationPeriods"] == 15
    assert alarm["TreatMissingData"] == "notBreaching"
    assert alarm["AlarmActions"] == alarm["OKActions"] == alarm["InsufficientDataActions"] == []


def test_deleting_idle_alarms_removes_them_and_a_second_delete_is_harmless(aws: None) -> None:
    cloudwatch = client("cloudwatch")
    alarms = CloudWatchIdleAlarms(client=cloudwatch, stack_name=STACK)
    alarms.create(job_id="j-1", instance_ids=["i-0aaa", "i-0bbb"], below_percent=5, minutes=15)

    alarms.delete(instance_ids=["i-0aaa", "i-0bbb"])
    alarms.delete(instance_ids=["i-0aaa", "i-0bbb"])

    assert cloudwatch.describe_alarms(AlarmNamePrefix="gpujobs-idle-")["MetricAlarms"] == []


def test_the_idle_alarms_of_this_stack_are_listed_by_instance_and_no_others(aws: None) -> None:
    cloudwatch = client("cloudwatch")
    CloudWatchIdleAlarms(client=cloudwatch, stack_name=f"{STACK}-staging").create(
        job_id="j-2", instance_ids=["i-0ccc"], below_percent=5, minutes=15
    )
    alarms = CloudWatchIdleAlarms(client=cloudwatch, stack_name=STACK)
    alarms.create(job_id="j-1", instance_ids=["i-0aaa", "i-0bbb"], below_percent=5, minutes=15)

    assert sorted(alarms.instance_ids()) == ["i-0aaa", "i-0bbb"]


def test_each_idle_alarm_says_whether_its_last_evaluation_saw_a_gpu_datapoint(aws: None) -> None:
    """StateReasonData's `recentDatapoints` (CloudWatch writes it on each evaluation; moto only when
    told, through SetAlarmState): empty is a silent agent, absent is an alarm not evaluated yet."""
    cloudwatch = client("cloudwatch")
    alarms = CloudWatchIdleAlarms(client=cloudwatch, stack_name=STACK)
    alarms.create(job_id="j-1", instance_ids=["i-0fed", "i-0mute", "i-0new"], below_percent=5, minutes=15)
    for iid, points in (("i-0fed", [37.5]), ("i-0mute", [])):
        cloudwatch.set_alarm_state(
            AlarmName=alarm_name(STACK, iid),
            StateValue="OK",
            StateReason="Threshold Crossed: no datapoints were received for 15 periods",
            StateReasonData=json.dumps(
                {"version": "1.0", "statistic": "Average", "period": 60, "recentDatapoints": points, "threshold": 5.0}
            ),
        )

    states = {a.instance_id: (a.state, a.had_datapoints) for a in alarms.states()}

    assert states["i-0fed"] == ("OK", True)
    assert states["i-0mute"] == ("OK", False)
    assert states["i-0new"][1] is None
    assert sorted(alarms.instance_ids()) == sorted(states)


# --- checkpoint now over SSM ----------------------------------------------------------------------


def test_checkpoint_now_sends_the_stacks_document_with_the_container_name(aws: None) -> None:
    ssm = client("ssm")
    document = properties("CheckpointNowDocument")  # moto does not need it; AWS does
    ssm.create_document(Name="gpujobs-checkpoint-now", Content=json.dumps(document["Content"]), DocumentType="Command")
    container = "gpujobs-j-0123456789abcdef-a2"

    SsmSignaller(client=ssm, document_name="gpujobs-checkpoint-now").checkpoint_now(
        instance_ids=["i-0aaa", "i-0bbb"], container=container
    )

    [command] = ssm.list_commands()["Commands"]
    assert command["DocumentName"] == "gpujobs-checkpoint-now"
    assert command["Parameters"] == {"containerName": [container], "signal": ["SIGUSR1"]}
    assert sorted(command["InstanceIds"]) == ["i-0aaa", "i-0bbb"]


def test_a_hung_gangs_dump_is_asked_for_with_sigusr2_through_the_same_document(aws: None) -> None:
    ssm = client("ssm")
    document = properties("CheckpointNowDocument")
    ssm.create_document(Name="gpujobs-checkpoint-now", Content=json.dumps(document["Content"]), DocumentType="Command")
    container = "gpujobs-j-0123456789abcdef-a3"

    SsmSignaller(client=ssm, document_name="gpujobs-checkpoint-now").dump_stacks(
        instance_ids=["i-0aaa"], container=container
    )

    [command] = ssm.list_commands()["Commands"]
    assert command["DocumentName"] == "gpujobs-checkpoint-now"
    assert command["Parameters"] == {"containerName": [container], "signal": ["SIGUSR2"]}


def test_checkpoint_now_without_instances_sends_nothing(aws: None) -> None:
    ssm = client("ssm")

    SsmSignaller(client=ssm, document_name="doc").checkpoint_now(instance_ids=[], container="c")

    assert ssm.list_commands()["Commands"] == []


# --- budget policies ------------------------------------------------------------------------------


@pytest.fixture
def book(aws: None) -> DynamoBudgetBook:
    dynamodb = client("dynamodb")
    dynamodb.create_table(**table_definition(table_name="t"))
    return DynamoBudgetBook(table_name="t", client=dynamodb)


def test_a_team_gets_the_strictest_of_its_own_policy_and_the_stack_wide_one(book: DynamoBudgetBook) -> None:
    since = datetime(2026, 11, 20, tzinfo=UTC)
    book.tighten(BudgetPolicy(scope="vision", mode=BudgetMode.SPOT_ONLY, reason="forecast", period="2026-11"))
    hold = book.tighten(BudgetPolicy(scope="all", mode=BudgetMode.HOLD, reason="actual", period="2026-11", since=since))

    assert book.policy_for("vision") == BudgetPolicy(
        scope="all", mode=BudgetMode.HOLD, reason="actual", period="2026-11", since=since
    )
    book.release(hold)
    assert book.policy_for("vision").mode is BudgetMode.SPOT_ONLY
    assert book.policy_for("speech") == BudgetPolicy(scope="all", mode=BudgetMode.NORMAL)


def test_a_team_without_any_policy_is_normal(book: DynamoBudgetBook) -> None:
    assert book.policy_for("vision") == BudgetPolicy(scope="vision", mode=BudgetMode.NORMAL)


def test_only_scopes_that_are_not_normal_are_held(book: DynamoBudgetBook) -> None:
    book.tighten(BudgetPolicy(scope="vision", mode=BudgetMode.SPOT_ONLY))
    hold = book.tighten(BudgetPolicy(scope="speech", mode=BudgetMode.HOLD))
    book.release(hold)  # lifted again
    book.tighten(BudgetPolicy(scope="all", mode=BudgetMode.NORMAL))

    assert [(p.scope, p.mode) for p in book.held_scopes()] == [("vision", BudgetMode.SPOT_ONLY)]


# --- the stack's instances ------------------------------------------------------------------------


@dataclass
class Fleet:
    ec2: Any
    compute: Ec2Compute

    def launch(self, tags: dict[str, str], *, spot: bool = False) -> str:
        params: dict[str, Any] = {
            "ImageId": AMI,
            "InstanceType": "g5.xlarge",
            "MinCount": 1,
            "MaxCount": 1,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ],
        }
        if spot:
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}
        instance_id: str = self.ec2.run_instances(**params)["Instances"][0]["InstanceId"]
        return instance_id

    def state(self, instance_id: str) -> str:
        reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        state: str = reservations[0]["Instances"][0]["State"]["Name"]
        return state


@pytest.fixture
def fleet(aws: None) -> Fleet:
    ec2 = client("ec2")
    compute = Ec2Compute(
        client=ec2, launch_template_id="lt-unused", security_group_id="sg-unused", subnet_ids=[], stack_name=STACK
    )
    return Fleet(ec2, compute)


def test_only_the_stacks_job_instances_are_listed_with_job_attempt_and_launch_time(fleet: Fleet) -> None:
    before = datetime.now(UTC) - timedelta(minutes=1)
    ours = fleet.launch({TAG_STACK: STACK, TAG_JOB: "j-1", TAG_ATTEMPT: "2"})
    fleet.launch({TAG_STACK: STACK})  # the stack's, but no job: not a training instance
    fleet.launch({TAG_STACK: "another-stack", TAG_JOB: "j-1", TAG_ATTEMPT: "2"})
    fleet.launch({TAG_JOB: "j-1", TAG_ATTEMPT: "2"})  # untagged by stack
    gone = fleet.launch({TAG_STACK: STACK, TAG_JOB: "j-0", TAG_ATTEMPT: "1"})
    fleet.ec2.terminate_instances(InstanceIds=[gone])

    [listed] = fleet.compute.list_instances()

    assert (listed.instance_id, listed.job_id, listed.attempt) == (ours, "j-1", 2)
    assert listed.state in {"pending", "running"}
    assert listed.launched_at >= before


def test_a_terminated_instance_tells_why_it_ended_and_a_running_one_nothing(fleet: Fleet) -> None:
    gone = fleet.launch({TAG_STACK: STACK, TAG_JOB: "j-1", TAG_ATTEMPT: "1"})
    running = fleet.launch({TAG_STACK: STACK, TAG_JOB: "j-1", TAG_ATTEMPT: "1"})
    fleet.ec2.terminate_instances(InstanceIds=[gone])

    assert fleet.compute.state_reason(gone) == "Client.UserInitiatedShutdown: User initiated shutdown"
    assert fleet.compute.state_reason(running) is None


def test_stop_moves_an_on_demand_instance_to_stopped(fleet: Fleet) -> None:
    instance_id = fleet.launch({TAG_STACK: STACK, TAG_JOB: "j-1", TAG_ATTEMPT: "1"})

    fleet.compute.stop([instance_id])

    assert fleet.state(instance_id) == "stopped"
    [listed] = fleet.compute.list_instances()
    assert listed.state == "stopped"  # stopped instances still hold the job's volumes: still listed


def test_find_instances_tells_spot_from_on_demand(fleet: Fleet) -> None:
    spot = fleet.launch({TAG_STACK: STACK, TAG_JOB: "j-1", TAG_ATTEMPT: "1"}, spot=True)
    on_demand = fleet.launch({TAG_STACK: STACK, TAG_JOB: "j-1", TAG_ATTEMPT: "1"})

    markets = {i.instance_id: i.market for i in fleet.compute.find_instances(job_id="j-1", attempt=1)}

    assert markets == {spot: Market.SPOT, on_demand: Market.ON_DEMAND}


# --- prices ---------------------------------------------------------------------------------------


class StepClock:
    def __init__(self) -> None:
        self.at = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.at


@pytest.fixture
def ec2_calls(aws: None) -> tuple[Any, list[str]]:
    ec2 = client("ec2")
    calls: list[str] = []
    ec2.meta.events.register("before-call.ec2.DescribeSpotPriceHistory", lambda **_: calls.append("spot"))
    return ec2, calls


def test_on_demand_prices_come_from_the_packaged_table(ec2_calls: tuple[Any, list[str]]) -> None:
    ec2, calls = ec2_calls
    prices = Ec2Prices(client=ec2)

    assert prices.hourly_usd(instance_type="g5.xlarge", market=Market.ON_DEMAND, zone="us-east-1a") == 1.006
    assert prices.hourly_usd(instance_type="c7i.large", market=Market.ON_DEMAND, zone=None) == pytest.approx(0.08925)
    assert calls == []


def test_every_type_in_the_default_allow_list_has_an_on_demand_price(ec2_calls: tuple[Any, list[str]]) -> None:
    allowed = str(parameter_default("AllowedInstanceTypes")).split(",")
    prices = Ec2Prices(client=ec2_calls[0])

    missing = [t for t in allowed if prices.hourly_usd(instance_type=t, market=Market.ON_DEMAND, zone=None) is None]

    assert allowed
    assert missing == []


def test_spot_prices_come_from_the_price_history_and_are_cached_for_ten_minutes(
    ec2_calls: tuple[Any, list[str]],
) -> None:
    ec2, calls = ec2_calls
    clock = StepClock()
    prices = Ec2Prices(client=ec2, clock=clock)

    first = prices.hourly_usd(instance_type="g5.xlarge", market=Market.SPOT, zone="us-east-1a")
    clock.at += timedelta(minutes=9)
    again = prices.hourly_usd(instance_type="g5.xlarge", market=Market.SPOT, zone="us-east-1a")
    other_zone = prices.hourly_usd(instance_type="g5.xlarge", market=Market.SPOT, zone="us-east-1b")
    clock.at += timedelta(minutes=2)
    later = prices.hourly_usd(instance_type="g5.xlarge", market=Market.SPOT, zone="us-east-1a")

    assert first == again == other_zone == later == pytest.approx(0.00001)  # moto's fake price
    assert calls == ["spot", "spot", "spot"]  # 1a, 1b, then 1a again once ten minutes passed


class NoSpotHistory:
    """EC2 as it answers for a type without spot capacity (moto has a fake price for every type)."""

    def describe_spot_price_history(self, **_: Any) -> dict[str, Any]:
        return {"SpotPriceHistory": []}


class SpotPricesUnavailable:
    def describe_spot_price_history(self, **_: Any) -> dict[str, Any]:
        raise ClientError(
            {"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "DescribeSpotPriceHistory"
        )


@pytest.mark.parametrize("ec2", [NoSpotHistory(), SpotPricesUnavailable()], ids=["no-history", "api-error"])
def test_spot_falls_back_to_the_on_demand_price_so_a_cap_errs_high(ec2: Any) -> None:
    prices = Ec2Prices(client=ec2)

    assert prices.hourly_usd(instance_type="p5.48xlarge", market=Market.SPOT, zone="us-east-1a") == 55.04


def test_an_unknown_type_has_no_price(ec2_calls: tuple[Any, list[str]]) -> None:
    prices = Ec2Prices(client=ec2_calls[0])

    assert prices.hourly_usd(instance_type="x99.mega", market=Market.ON_DEMAND, zone=None) is None
    assert prices.hourly_usd(instance_type="x99.mega", market=Market.SPOT, zone="us-east-1a") is None
