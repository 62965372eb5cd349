"""`gpujobs bake` prints the AMI with the exact commands that make the stack launch it, in a safe order.

The stack's launch template names an SSM parameter (AmiParameter), which EC2 reads at every launch,
and IAM lets the launcher start only AMIs of AllowedAmiOwners. So a baked AMI needs its id in a
parameter of your own, the stack pointed at that parameter, and this account among the owners;
and where the stack already reads that parameter, the owner must be allowed before the id goes in.
"""

from __future__ import annotations

import pytest

from gpujobs_cli.bake import next_steps, parameter_for
from gpujobs_cli.baker import Baked, BakeTarget, read_report
from gpujobs_cli.commands import CommandError

ACCOUNT = "123456789012"
DLAMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"


def a_stack(*, ami_parameter: str, owners: tuple[str, ...] = ("amazon",)) -> BakeTarget:
    return BakeTarget(
        stack="gpujobs",
        ami_parameter=ami_parameter,
        source_ami="ami-0source",
        architecture="x86_64",
        root_device="/dev/sda1",
        volume_gib=200,
        kms_key="",
        subnet="subnet-0aaa",
        security_group="sg-0aaa",
        instance_profile="gpujobs-InstanceProfile-X",
        allowed_owners=owners,
    )


BAKED = Baked(ami_id="ami-0baked", name="gpujobs-gpujobs-20261206T000000Z", owner=ACCOUNT, builder="i-0b")


def test_a_stack_on_the_public_dlami_parameter_gets_its_own_parameter_then_a_deploy_pointing_at_it() -> None:
    stack = a_stack(ami_parameter=DLAMI)

    parameter = parameter_for(None, stack)

    assert parameter == "/platform/gpujobs/gpujobs/ami"
    assert next_steps(stack, BAKED, parameter=parameter, written=False) == [
        "aws ssm put-parameter --name /platform/gpujobs/gpujobs/ami --type String --data-type aws:ec2:image "
        "--value ami-0baked --overwrite",
        "sam deploy --stack-name gpujobs --parameter-overrides AmiParameter=/platform/gpujobs/gpujobs/ami "
        f"AllowedAmiOwners=amazon,{ACCOUNT}",
    ]


def test_a_stack_on_its_own_parameter_allows_the_owner_before_the_id_is_written() -> None:
    stack = a_stack(ami_parameter="/platform/gpujobs/ami")

    steps = next_steps(stack, BAKED, parameter=parameter_for(None, stack), written=False)

    assert steps == [
        f"sam deploy --stack-name gpujobs --parameter-overrides AllowedAmiOwners=amazon,{ACCOUNT}",
        "aws ssm put-parameter --name /platform/gpujobs/ami --type String --data-type aws:ec2:image "
        "--value ami-0baked --overwrite",
    ]


def test_nothing_is_left_to_do_once_the_stacks_own_parameter_holds_an_ami_it_may_launch() -> None:
    stack = a_stack(ami_parameter="/platform/gpujobs/ami", owners=("amazon", ACCOUNT))

    assert next_steps(stack, BAKED, parameter="/platform/gpujobs/ami", written=True) == []


@pytest.mark.parametrize("given", ["/aws/service/x", "platform/ami", "/platform/ami; rm -rf /", "/p/$(id)"])
def test_a_parameter_that_is_not_one_of_your_own_is_refused(given: str) -> None:
    with pytest.raises(CommandError, match="an SSM parameter name of your own"):
        parameter_for(given, a_stack(ami_parameter=DLAMI))


def test_only_the_report_with_this_bakes_nonce_counts() -> None:
    console = (
        "gpujobs-bake: ok 00aa b2s=\n"  # an earlier bake's line, on an AMI baked from a baked AMI
        "[  12.3] cloud-init[901]: ...\n"
        "gpujobs-bake: failed 11bb ZG9ja2VyIHB1bGwgZmFpbGVk\n"
    )

    assert read_report(console, "11bb") == ("failed", "docker pull failed")
    assert read_report(console, "22cc") is None
