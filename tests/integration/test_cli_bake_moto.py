"""`gpujobs bake` against a stack on moto: an AMI with the images pulled, tagged, and the builder gone.

moto launches the builder, makes the AMI and holds the SSM parameter, but runs no user data. The
builder's part is played here (`PlayedBuilder`): when the bake's sleeper has let five minutes pass,
it runs the very program of the builder's user data with a fake docker, then stops the instance as
that program's `shutdown -h now` would; the console output the CLI reads is what the program wrote.
The clock and the sleeper are the bake's injected ones, so nothing here sleeps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from gpujobs_cli import bake
from gpujobs_cli.baker import HEREDOC
from gpujobs_cli.main import main
from tests.cli_aws import cli_on_moto

pytestmark = pytest.mark.integration

REGION = "us-east-1"
STACK = "gpujobs-bake"
ACCOUNT = "123456789012"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/train:1"
DIGEST = "sha256:" + "d" * 64
PARAMETER = "/platform/gpujobs/ami"
FAKE_TOOL = """import json, os, sys
argv = [os.path.basename(sys.argv[0])] + sys.argv[1:]
if "--password-stdin" in argv:
    sys.stdin.read()
if argv[:2] == ["docker", "pull"] and os.environ.get("FAKE_REFUSE"):
    sys.exit("Error response from daemon: manifest unknown")
if argv[:3] == ["docker", "image", "inspect"]:
    print(json.dumps([argv[-1].rsplit(":", 1)[0] + "@" + os.environ["FAKE_DIGEST"]]))
if argv[:2] == ["aws", "ecr"]:
    print("password")
"""


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with cli_on_moto(monkeypatch, REGION):
        yield


class Stack:
    """A deployed stack as `gpujobs bake` reads it: parameters, instance profile, security group, AMI parameter."""

    def __init__(self, *, owners: str = "amazon", kms_key: str = "") -> None:
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.ssm = boto3.client("ssm", region_name=REGION)
        vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnet = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
        self.source_ami = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        self.ssm.put_parameter(Name=PARAMETER, Value=self.source_ami, Type="String", DataType="aws:ec2:image")
        names = ("VpcId", "SubnetIds", "AmiParameter", "AllowedAmiOwners", "RootVolumeGiB", "EbsKmsKeyArn")
        role = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ],
        }
        template = {
            "Parameters": {name: {"Type": "String", "Default": ""} for name in names},
            "Resources": {
                "InstanceRole": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": role}},
                "InstanceProfile": {
                    "Type": "AWS::IAM::InstanceProfile",
                    "Properties": {"Roles": [{"Ref": "InstanceRole"}]},
                },
                "InstanceSecurityGroup": {
                    "Type": "AWS::EC2::SecurityGroup",
                    "Properties": {"GroupDescription": "egress only", "VpcId": {"Ref": "VpcId"}},
                },
            },
        }
        values = {"VpcId": vpc, "SubnetIds": self.subnet, "AmiParameter": PARAMETER, "AllowedAmiOwners": owners}
        values.update({"RootVolumeGiB": "200", "EbsKmsKeyArn": kms_key})
        cloudformation = boto3.client("cloudformation", region_name=REGION)
        cloudformation.create_stack(
            StackName=STACK,
            TemplateBody=json.dumps(template),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in values.items()],
        )

        def physical(logical_id: str) -> str:
            found = cloudformation.describe_stack_resource(StackName=STACK, LogicalResourceId=logical_id)
            return str(found["StackResourceDetail"]["PhysicalResourceId"])

        self.profile, self.group = physical("InstanceProfile"), physical("InstanceSecurityGroup")

    def instances(self) -> list[dict[str, Any]]:
        return [i for r in self.ec2.describe_instances()["Reservations"] for i in r["Instances"]]

    def own_images(self) -> list[dict[str, Any]]:
        return list(self.ec2.describe_images(Owners=["self"])["Images"])


class PlayedBuilder:
    """Plays the builder's part on moto (which runs no user data); the bake's clock and sleeper."""

    def __init__(self, tmp_path: Path, *, pulls_for: float = 300.0, refuse: bool = False) -> None:
        self.tmp_path, self.pulls_for, self.refuse = tmp_path, pulls_for, refuse
        self.unknown_at_first = True
        self.now = 1000.0
        self.requests: list[dict[str, Any]] = []
        self.builder = ""
        self.console = ""
        self.ec2 = boto3.client("ec2", region_name=REGION)

    def clients(self, service: str) -> Any:
        if service != "ec2":
            return boto3.client(service, region_name=REGION)
        played = self

        class Ec2:
            def __getattr__(self, name: str) -> Any:
                return getattr(played.ec2, name)

            def run_instances(self, **request: Any) -> Any:
                played.requests.append(request)
                answer = played.ec2.run_instances(**request)
                played.builder = answer["Instances"][0]["InstanceId"]
                return answer

            def describe_instances(self, **request: Any) -> Any:
                if played.unknown_at_first:  # EC2's reads lag its writes: a new instance may be NotFound for a moment
                    played.unknown_at_first = False
                    error = {"Error": {"Code": "InvalidInstanceID.NotFound", "Message": "not yet"}}
                    raise ClientError(error, "DescribeInstances")
                return played.ec2.describe_instances(**request)

            def get_console_output(self, **_: Any) -> dict[str, Any]:
                return {"InstanceId": played.builder, "Output": played.console}

        return Ec2()

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.builder and not self.console and self.now >= 1000.0 + self.pulls_for:
            self._run_the_user_data()
            self.ec2.stop_instances(InstanceIds=[self.builder])  # as the program's `shutdown -h now`

    def _run_the_user_data(self) -> None:
        bin_dir = self.tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        for tool in ("docker", "aws", "shutdown", "systemctl"):
            (bin_dir / tool).write_text(f"#!{sys.executable}\n{FAKE_TOOL}")
            (bin_dir / tool).chmod(0o755)
        user_data = self.requests[0]["UserData"]
        program = user_data.split(f"<<'{HEREDOC}'\n", 1)[1].rsplit(f"{HEREDOC}\n", 1)[0]
        call = program.rstrip().splitlines()[-1]
        console = self.tmp_path / "console"
        program = program.replace(call, call.removesuffix("))") + f", console={str(console)!r}))")
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_DIGEST": DIGEST, "FAKE_REFUSE": "1" if self.refuse else ""}
        subprocess.run([sys.executable, "-"], input=program, env=env, text=True, capture_output=True, check=False)
        self.console = (
            "[    0.000000] Linux version 6.8.0-1021-aws\ncloud-init: running user scripts\n" + console.read_text()
        )


def run_bake(
    monkeypatch: pytest.MonkeyPatch, played: PlayedBuilder, *args: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    monkeypatch.setattr(bake, "Resources", lambda stack, region: SimpleNamespace(client=played.clients))
    monkeypatch.setattr(bake, "clock", played.clock)
    monkeypatch.setattr(bake, "sleep", played.sleep)
    code = main(["bake", "--stack", STACK, *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.usefixtures("aws")
def test_a_bake_leaves_a_tagged_ami_holding_the_image_and_no_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a stack whose AmiParameter names the DLAMI, and a builder that pulls for five minutes
    stack, played = Stack(), PlayedBuilder(tmp_path)

    # when the platform team bakes the training image into an AMI
    code, out, err = run_bake(monkeypatch, played, IMAGE, "--name", "gpujobs-test-1", capsys=capsys)

    # then an available AMI of this account exists, tagged as the stack's with what it holds
    assert code == 0, err
    (ami,) = stack.own_images()
    tags = {t["Key"]: t["Value"] for t in ami["Tags"]}
    assert ami["State"] == "available"
    assert ami["Name"] == "gpujobs-test-1"
    assert tags == {
        "gpujobs:stack": STACK,
        "Name": "gpujobs-test-1",
        "gpujobs:baked-from": stack.source_ami,
        "gpujobs:image-1": IMAGE,
        "gpujobs:image-1-digest": DIGEST,
    }
    (snapshot,) = [m["Ebs"]["SnapshotId"] for m in ami["BlockDeviceMappings"]]
    (described,) = stack.ec2.describe_snapshots(SnapshotIds=[snapshot])["Snapshots"]
    assert {"Key": "gpujobs:stack", "Value": STACK} in described["Tags"]
    # and the builder is gone
    (builder,) = stack.instances()
    assert builder["State"]["Name"] == "terminated"
    # and the AMI id comes with the steps that make the stack use it, in the order that keeps launches working
    assert out.splitlines()[0].startswith(f"{ami['ImageId']}  gpujobs-test-1  (from {stack.source_ami}")
    assert out.splitlines()[-2:] == [
        f"  sam deploy --stack-name {STACK} --parameter-overrides AllowedAmiOwners=amazon,{ACCOUNT}",
        f"  aws ssm put-parameter --name {PARAMETER} --type String --data-type aws:ec2:image "
        f"--value {ami['ImageId']} --overwrite",
    ]
    assert "builder" in err  # progress on stderr
    assert f"{IMAGE} pulled in " in err


@pytest.mark.usefixtures("aws")
def test_the_builder_is_launched_as_a_training_instance_is_and_gets_the_images_only_as_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack, played = Stack(kms_key="arn:aws:kms:us-east-1:123456789012:key/k"), PlayedBuilder(tmp_path)

    code, _, err = run_bake(monkeypatch, played, IMAGE, capsys=capsys)

    assert code == 0, err
    (request,) = played.requests
    assert request["ImageId"] == stack.source_ami
    assert request["MetadataOptions"]["HttpTokens"] == "required"
    ((interface,),) = [request["NetworkInterfaces"]]
    assert interface["AssociatePublicIpAddress"] is False
    assert (interface["SubnetId"], interface["Groups"]) == (stack.subnet, [stack.group])
    assert "KeyName" not in request
    assert request["IamInstanceProfile"] == {"Name": stack.profile}
    ((volume,),) = [request["BlockDeviceMappings"]]
    assert volume["Ebs"] == {
        "VolumeSize": 200,
        "VolumeType": "gp3",
        "Encrypted": True,
        "DeleteOnTermination": True,
        "KmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/k",
    }
    assert request["InstanceInitiatedShutdownBehavior"] == "stop"
    assert {spec["ResourceType"] for spec in request["TagSpecifications"]} == {
        "instance",
        "volume",
        "network-interface",
    }
    assert all({"Key": "gpujobs:stack", "Value": STACK} in spec["Tags"] for spec in request["TagSpecifications"])
    assert IMAGE not in request["UserData"]  # only inside the base64 data the builder's program decodes
    (builder,) = stack.instances()
    assert builder["MetadataOptions"]["HttpTokens"] == "required"
    assert "PublicIpAddress" not in builder
    assert "KeyName" not in builder


@pytest.mark.usefixtures("aws")
def test_with_write_parameter_the_stacks_next_launches_use_the_ami(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack, played = Stack(owners=f"amazon,{ACCOUNT}"), PlayedBuilder(tmp_path)

    code, out, err = run_bake(monkeypatch, played, IMAGE, "--write-parameter", "--json", capsys=capsys)

    assert code == 0, err
    result = json.loads(out)
    assert stack.ssm.get_parameter(Name=PARAMETER)["Parameter"]["Value"] == result["ami_id"]
    assert result["parameter_written"] is True
    assert result["next_steps"] == []
    assert result["source_ami"] == stack.source_ami
    assert [(i["image"], i["digests"]) for i in result["images"]] == [(IMAGE, [f"{IMAGE.rsplit(':', 1)[0]}@{DIGEST}"])]


@pytest.mark.usefixtures("aws")
def test_write_parameter_is_refused_before_any_launch_when_the_stack_does_not_allow_this_accounts_amis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack, played = Stack(owners="amazon"), PlayedBuilder(tmp_path)

    code, _, err = run_bake(monkeypatch, played, IMAGE, "--write-parameter", capsys=capsys)

    assert code == 2
    assert f"AllowedAmiOwners=amazon,{ACCOUNT}" in err
    assert stack.instances() == []
    assert stack.ssm.get_parameter(Name=PARAMETER)["Parameter"]["Value"] == stack.source_ami


@pytest.mark.usefixtures("aws")
def test_a_pull_the_builder_could_not_make_leaves_no_ami_and_no_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack, played = Stack(), PlayedBuilder(tmp_path, refuse=True)

    code, out, err = run_bake(monkeypatch, played, IMAGE, capsys=capsys)

    assert code == 1
    assert out == ""
    assert "failed: docker pull" in err
    assert "manifest unknown" in err
    assert stack.own_images() == []
    assert [i["State"]["Name"] for i in stack.instances()] == ["terminated"]


@pytest.mark.usefixtures("aws")
def test_a_builder_that_never_finishes_is_terminated_at_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack, played = Stack(), PlayedBuilder(tmp_path, pulls_for=float("inf"))

    code, _, err = run_bake(monkeypatch, played, IMAGE, "--timeout", "20", capsys=capsys)

    assert code == 1
    assert "did not finish in time" in err
    assert played.now - 1000.0 >= 20 * 60
    assert stack.own_images() == []
    assert [i["State"]["Name"] for i in stack.instances()] == ["terminated"]


@pytest.mark.usefixtures("aws")
def test_a_hostile_image_reference_launches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack, played = Stack(), PlayedBuilder(tmp_path)

    code, _, err = run_bake(monkeypatch, played, IMAGE, "img:1;reboot", capsys=capsys)

    assert code == 2
    assert "not a plain image reference" in err
    assert stack.instances() == []
