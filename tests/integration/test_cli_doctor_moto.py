"""`gpujobs doctor` against a stack on moto: what an account lacks is named, with its fix.

moto answers the stack, the subnets, their routes and the VPC's endpoints, IAM's spot role and the
alarm topic's subscriptions, so those checks run on moto. It has no Lambda account settings, no EC2
quotas in Service Quotas and no EBS default key: on moto those checks answer `unknown` naming the
call (asserted below), and their verdicts are tested with fakes of exactly those three answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from gpujobs_cli.doctor import FAIL, OK, REQUIRED_ENDPOINTS, UNKNOWN, WARN, Doctor, Finding
from gpujobs_cli.main import main
from tests.cli_aws import cli_on_moto
from tests.integration.test_every_call_is_allowed import _documented_endpoints

pytestmark = pytest.mark.integration

REGION = "us-east-1"
STACK = "gpujobs-doctor"
TYPES = "g5.xlarge,p4d.24xlarge,c7i.large"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with cli_on_moto(monkeypatch, REGION):
        yield


class Account:
    """A VPC with one private subnet, and a stack whose parameters name it (moto's CloudFormation)."""

    def __init__(self, *, public_ips: bool = False, ebs_key: str = "") -> None:
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnet = self.ec2.create_subnet(VpcId=self.vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
        if public_ips:
            self.ec2.modify_subnet_attribute(SubnetId=self.subnet, MapPublicIpOnLaunch={"Value": True})
        template = {
            "Parameters": {
                name: {"Type": "String", "Default": ""}
                for name in (
                    "SubnetIds",
                    "AllowedInstanceTypes",
                    "EbsKmsKeyArn",
                    "ImageRepositoryArns",
                    "AlarmTopicArn",
                )
            },
            "Resources": {"AlarmTopic": {"Type": "AWS::SNS::Topic"}},
            "Outputs": {"AlarmTopicArn": {"Value": {"Ref": "AlarmTopic"}}},
        }
        parameters = {"SubnetIds": self.subnet, "AllowedInstanceTypes": TYPES, "EbsKmsKeyArn": ebs_key}
        parameters["ImageRepositoryArns"] = "arn:aws:ecr:*:763104351884:repository/*"
        boto3.client("cloudformation", region_name=REGION).create_stack(
            StackName=STACK,
            TemplateBody=json.dumps(template),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
        )
        outputs = boto3.client("cloudformation", region_name=REGION).describe_stacks(StackName=STACK)
        self.topic = outputs["Stacks"][0]["Outputs"][0]["OutputValue"]

    def endpoints(self, *names: str) -> None:
        for name in names:
            kind = "Gateway" if name == "s3" else "Interface"
            self.ec2.create_vpc_endpoint(
                VpcId=self.vpc,
                ServiceName=f"com.amazonaws.{REGION}.{name}",
                VpcEndpointType=kind,
                PrivateDnsEnabled=kind == "Interface",
            )

    def nat_route(self) -> None:
        table = self.ec2.create_route_table(VpcId=self.vpc)["RouteTable"]["RouteTableId"]
        self.ec2.associate_route_table(RouteTableId=table, SubnetId=self.subnet)
        allocation = self.ec2.allocate_address(Domain="vpc")["AllocationId"]
        nat = self.ec2.create_nat_gateway(SubnetId=self.subnet, AllocationId=allocation)["NatGateway"]["NatGatewayId"]
        self.ec2.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat)


def _doctor(clients: Any = None) -> dict[str, list[Finding]]:
    found = Doctor(
        clients or (lambda service: boto3.client(service, region_name=REGION)), stack=STACK, region=REGION
    ).run()
    by_check: dict[str, list[Finding]] = {}
    for finding in found:
        by_check.setdefault(finding.check, []).append(finding)
    return by_check


@pytest.mark.usefixtures("aws")
def test_private_subnets_without_nat_are_told_which_endpoints_they_lack_until_none() -> None:
    account = Account()

    (before,) = _doctor()["network"]
    account.endpoints(*(e for e in REQUIRED_ENDPOINTS if e not in ("lambda", "ecr.api")))
    (most,) = _doctor()["network"]
    account.endpoints("lambda", "ecr.api")
    (all_there,) = _doctor()["network"]

    assert before.status == FAIL
    assert all(name in before.detail for name in REQUIRED_ENDPOINTS)
    assert (most.status, most.detail) == (FAIL, f"{account.subnet}: no NAT route and no endpoint for lambda, ecr.api")
    assert "com.amazonaws.us-east-1.{lambda,ecr.api}" in most.fix
    assert all_there.status == OK


@pytest.mark.usefixtures("aws")
def test_a_subnet_with_a_nat_route_needs_no_endpoint_and_one_mapping_public_ips_is_a_warning() -> None:
    account = Account(public_ips=True)
    account.nat_route()

    found = _doctor()

    assert [f.status for f in found["network"]] == [OK]
    (public,) = found["public ips"]
    assert public.status == WARN
    assert account.subnet in public.detail


@pytest.mark.usefixtures("aws")
def test_the_spot_role_and_the_alarm_subscribers_are_checked_and_the_rest_of_moto_answers_unknown() -> None:
    account = Account()
    first = _doctor()
    boto3.client("iam").create_role(
        RoleName="AWSServiceRoleForEC2Spot", AssumeRolePolicyDocument="{}", Path="/aws-service-role/spot.amazonaws.com/"
    )
    boto3.client("sns", region_name=REGION).subscribe(
        TopicArn=account.topic, Protocol="email", Endpoint="oncall@example.com"
    )
    second = _doctor()

    assert [f.status for f in first["spot role"]] == [WARN]
    assert "create-service-linked-role" in first["spot role"][0].fix
    assert [f.status for f in first["alarm topic"]] == [WARN]
    assert [f.status for f in second["spot role"]] == [OK]
    assert [f.status for f in second["alarm topic"]] == [OK]
    # moto has these calls not: each is said, not guessed
    for check in ("lambda concurrency", "ebs key"):
        (finding,) = second[check]
        assert finding.status == UNKNOWN
        assert finding.detail.startswith("could not check")
    assert {f.status for check, fs in second.items() if check.startswith("quota ") for f in fs} == {UNKNOWN}
    assert second["cost allocation tags"][0].status == UNKNOWN


class ThreeAnswers:
    """moto's clients, except the three answers moto does not have (Lambda's account settings, EC2
    quotas, the EBS default key), which are given."""

    def __init__(self, *, concurrency: int, quotas: dict[str, float], default_key_manager: str) -> None:
        self.concurrency, self.quotas, self.manager = concurrency, quotas, default_key_manager

    def __call__(self, service: str) -> Any:
        real = boto3.client(service, region_name=REGION)
        if service == "lambda":
            total = self.concurrency
            real.get_account_settings = lambda: {
                "AccountLimit": {"ConcurrentExecutions": total, "UnreservedConcurrentExecutions": total}
            }
        if service == "service-quotas":
            real.get_service_quota = lambda **kw: {"Quota": {"Value": self.quotas[kw["QuotaCode"]]}}
        if service == "ec2":
            real.get_ebs_default_kms_key_id = lambda: {"KmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/default"}
        if service == "kms":
            arn = "arn:aws:kms:us-east-1:123456789012:key/default"
            real.describe_key = lambda **_: {"KeyMetadata": {"Arn": arn, "KeyManager": self.manager}}
        return real


FULL_QUOTAS = {
    "L-DB2E81BA": 64,
    "L-417A185B": 96,
    "L-1216C47A": 32,
    "L-3819A6DF": 64,
    "L-7212CCBC": 96,
    "L-34B43A08": 32,
}


@pytest.mark.usefixtures("aws")
def test_a_new_account_is_told_its_quotas_of_zero_its_low_concurrency_and_its_customer_managed_ebs_key() -> None:
    Account()
    found = _doctor(
        ThreeAnswers(
            concurrency=10, quotas={**FULL_QUOTAS, "L-417A185B": 0, "L-7212CCBC": 0}, default_key_manager="CUSTOMER"
        )
    )

    (concurrency,) = found["lambda concurrency"]
    assert concurrency.status == WARN  # no reservation: it deploys, but nothing may be reserved
    assert "L-B99A9384" in concurrency.fix
    (p_on_demand,) = found["quota L-417A185B"]
    assert (p_on_demand.status, p_on_demand.detail) == (
        FAIL,
        "Running On-Demand P instances (on-demand): 0 vCPUs; one p4d.24xlarge needs 96",
    )
    assert "--quota-code L-417A185B --desired-value 96" in p_on_demand.fix
    assert found["quota L-7212CCBC"][0].status == FAIL
    assert found["quota L-DB2E81BA"][0].status == OK
    (key,) = found["ebs key"]
    assert key.status == FAIL
    assert "EbsKmsKeyArn=arn:aws:kms:us-east-1:123456789012:key/default" in key.fix


@pytest.mark.usefixtures("aws")
def test_an_account_with_its_quotas_and_the_stacks_key_passes_those_checks() -> None:
    Account(ebs_key="arn:aws:kms:us-east-1:123456789012:key/default")
    found = _doctor(ThreeAnswers(concurrency=1000, quotas=FULL_QUOTAS, default_key_manager="CUSTOMER"))

    assert {f.status for check, fs in found.items() if check.startswith("quota ") for f in fs} == {OK}
    assert found["lambda concurrency"][0].status == OK
    assert found["ebs key"][0].status == OK


@pytest.mark.usefixtures("aws")
def test_the_command_prints_each_check_and_exits_1_when_one_fails(capsys: pytest.CaptureFixture[str]) -> None:
    Account()

    code = main(["doctor", "--stack", STACK, "--region", REGION, "--json"])
    printed = json.loads(capsys.readouterr().out)
    text_code = main(["doctor", "--stack", STACK, "--region", REGION])
    text = capsys.readouterr().out

    assert code == text_code == 1  # no NAT and no endpoints
    assert {"check": "stack", "status": "ok", "detail": f"{STACK}: CREATE_COMPLETE", "fix": ""} in printed
    assert text.startswith(f"gpujobs doctor: stack {STACK} in {REGION}\n")
    assert "FAIL    network" in text
    assert text.rstrip().endswith("not checked")


@pytest.mark.usefixtures("aws")
def test_a_missing_stack_is_one_failure_that_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--stack", "nope", "--region", REGION])

    assert code == 1
    assert "cannot describe stack 'nope'" in capsys.readouterr().out


def test_the_doctor_wants_the_endpoints_the_deploy_guide_lists() -> None:
    assert set(REQUIRED_ENDPOINTS) == set(_documented_endpoints())


@pytest.mark.usefixtures("aws")
def test_the_fleet_cap_is_judged_against_the_gpus_the_vcpu_quotas_allow() -> None:
    """FULL_QUOTAS: G 64 vCPUs on-demand and spot (16 g5.xlarge GPUs each), P 96 (8 p4d GPUs each): 48."""
    Account()
    found = _doctor(ThreeAnswers(concurrency=1000, quotas=FULL_QUOTAS, default_key_manager="AWS"))
    (uncapped,) = found["fleet cap"]
    assert uncapped.status == WARN
    assert "allow about 48 GPUs" in uncapped.detail
    assert '"max_gpus": 48' in uncapped.fix

    ssm = boto3.client("ssm", region_name=REGION)
    for cap, status in ((64, WARN), (40, OK)):
        config = {"teams": {"vision": {"principals": ["AROAEXAMPLEID1234567"]}}, "fleet": {"max_gpus": cap}}
        ssm.put_parameter(Name="/platform/teams", Value=json.dumps(config), Type="String", Overwrite=True)
        doctor = Doctor(
            ThreeAnswers(concurrency=1000, quotas=FULL_QUOTAS, default_key_manager="AWS"), stack=STACK, region=REGION
        )
        doctor.parameters = {"TeamsParameterName": "/platform/teams"}
        doctor.gpus_quotas_allow = 48
        (judged,) = doctor.fleet_cap()
        assert judged.status == status, judged
