"""The local cloud's FIS: a drill `gpujobs interrupt` started is played once on the instance it names.

moto stores FIS experiments and plays none; `fis_agent.LocalFisAgent` plays their spot interruptions
through the instance runner (the IMDS notice, the warning event, the reclaim after the notice), with
the local cloud's notice when it is shorter than the experiment's. Here the runner is a recording
stand-in: what the runner then does to the machine is `test_local_instances`' story.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs_cli.drills import experiment_template
from gpujobs_local.fis_agent import LocalFisAgent, duration_seconds

pytestmark = pytest.mark.integration

ROLE = "arn:aws:iam::123456789012:role/gpujobs-local-SpotDrillRole"


@dataclass
class RecordingRunner:
    instances: dict[str, object] = field(default_factory=dict)
    interrupted: list[tuple[str, float]] = field(default_factory=list)

    def interrupt_spot(self, instance_id: str, *, notice_seconds: float) -> None:
        self.interrupted.append((instance_id, notice_seconds))


@dataclass
class Local:
    ec2: Any
    fis: Any
    runner: RecordingRunner

    def launch(self, *, spot: bool) -> str:
        market = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        (inst,) = self.ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, **market)["Instances"]
        self.runner.instances[inst["InstanceId"]] = object()
        return str(inst["InstanceId"])

    def drill(self, instance_id: str, *, notice: str = "PT2M") -> str:
        arn = f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"
        request = experiment_template(job_id="j-1", stack="gpujobs-local", arn=arn, role_arn=ROLE, token=instance_id)
        request["actions"]["interrupt"]["parameters"]["durationBeforeInterruption"] = notice
        template = self.fis.create_experiment_template(**request)["experimentTemplate"]
        return str(self.fis.start_experiment(experimentTemplateId=template["id"])["experiment"]["id"])

    def agent(self, *, notice_seconds: float) -> LocalFisAgent:
        runner: Any = self.runner
        return LocalFisAgent(fis=self.fis, ec2=self.ec2, runner=runner, notice_seconds=notice_seconds, poll_seconds=0)


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> Iterator[Local]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield Local(boto3.client("ec2"), boto3.client("fis"), RecordingRunner())


def test_a_drill_is_played_once_on_its_spot_instance_with_the_local_clouds_shorter_notice(local: Local) -> None:
    spot, other = local.launch(spot=True), local.launch(spot=True)
    experiment = local.drill(spot)
    agent = local.agent(notice_seconds=8)

    agent.poll()
    agent.poll()  # a later look finds nothing new

    assert local.runner.interrupted == [(spot, 8.0)]
    assert agent.interrupted == [(experiment, spot)]
    assert other not in dict(local.runner.interrupted)


def test_a_notice_shorter_than_the_local_clouds_is_kept(local: Local) -> None:
    spot = local.launch(spot=True)
    local.drill(spot, notice="PT5S")

    local.agent(notice_seconds=30).poll()

    assert local.runner.interrupted == [(spot, 5.0)]


def test_an_on_demand_instance_or_one_this_host_does_not_run_is_not_interrupted(local: Local) -> None:
    on_demand = local.launch(spot=False)
    local.drill(on_demand)
    local.drill("i-0000000000000dead")

    local.agent(notice_seconds=8).poll()

    assert local.runner.interrupted == []


def test_fis_durations_are_read_as_fis_writes_them() -> None:
    assert duration_seconds("PT2M") == 120
    assert duration_seconds("PT15M") == 900
    assert duration_seconds("PT1M30S") == 90
    with pytest.raises(ValueError, match="durationBeforeInterruption '2 minutes'"):
        duration_seconds("2 minutes")
    with pytest.raises(ValueError, match="PT"):
        duration_seconds("PT")
