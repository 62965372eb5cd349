"""`gpujobs bake`: make an AMI with a stack's training images already pulled, and say how to use it.

A replacement for an interrupted spot attempt pays its boot before it trains again, and most of the
boot is the image pull (4 to 6 minutes for a multi-GB image). An AMI whose docker store already
holds the image lets the bootstrap skip the pull (`gpujobs/instance/images.py` says when it may),
or pull only the layers that changed since. `baker.py` does the AWS work; this module checks the
arguments before anything is launched, and prints the AMI with the exact steps that make the stack
use it: the SSM parameter its AmiParameter names (written here with `--write-parameter`), a
`sam deploy --parameter-overrides` when the stack reads another parameter or does not yet allow
this account's AMIs (AllowedAmiOwners, enforced in IAM).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from gpujobs.instance import images
from gpujobs_cli.baker import BUILDER_TYPES, Baked, BakeFailedError, Baker, BakeTarget, pulled_in, read_target
from gpujobs_cli.commands import EXIT_FAILED, EXIT_OK, CommandError
from gpujobs_cli.resources import Resources

SUMMARY = "make an AMI with the training images already pulled (faster replacements)"
DESCRIPTION = """\
Launch one builder instance from the AMI the stack's AmiParameter names now (or --source-ami), as a training instance
is launched (the stack's instance profile, subnet and security group; IMDSv2 required, no public IP,
no SSH key, encrypted root volume of the stack's RootVolumeGiB, tagged gpujobs:stack), let it pull
IMAGE... into docker's store and power off, make an AMI from its volume, tag the AMI and its
snapshots as the stack's, and terminate the builder (also on failure or Ctrl-C).

Then print the AMI id and the steps that make the stack use it: an SSM put-parameter (done here with
--write-parameter) and, when needed, a sam deploy --parameter-overrides (AmiParameter when the stack
reads another parameter, AllowedAmiOwners when it does not allow this account's AMIs yet).
Instances on the AMI skip the pull of an image pinned by digest, or of an ECR tag the registry still
names as baked; any other image is pulled as before (docs/deploy.md, "Faster replacements: a baked
AMI"). Progress goes to stderr: the boot, the pulls and the snapshot take tens of minutes."""
EPILOG = """\
examples:
  gpujobs bake 123456789012.dkr.ecr.us-east-1.amazonaws.com/train@sha256:<digest>
  gpujobs bake 763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-gpu-py311-cu124-ubuntu22.04-ec2 \\
      --parameter /platform/gpujobs/ami --write-parameter
  gpujobs bake IMAGE --stack gpujobs-staging --subnet subnet-0aaa --json | jq -r .ami_id

exit codes: 0 the AMI is available, 1 the builder failed or ran out of time (nothing was made),
2 usage or configuration (a refused image reference, no stack, an AWS call refused)."""
MAX_IMAGES = 20
"""Each image takes two AMI tags (reference and digest) of the 50 EC2 allows."""
MAX_TAG_VALUE = 256
AMI_NAME = re.compile(r"^[A-Za-z0-9()\[\] ./'@_-]{3,128}$")
PARAMETER_NAME = re.compile(r"^/[a-zA-Z0-9_.\-/]+$")
"""The template's AllowedPattern for AmiParameter."""
clock: Callable[[], float] = time.monotonic
sleep: Callable[[float], None] = time.sleep
"""Replaced in tests, so that waiting loops run without waiting."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "images", nargs="+", metavar="IMAGE", help="image references to pull (repo:tag or repo@sha256:...)"
    )
    parser.add_argument(
        "--parameter",
        metavar="NAME",
        help="SSM parameter for the AMI id (default: the stack's AmiParameter, or /platform/gpujobs/STACK/ami "
        "when that is a public /aws/ parameter)",
    )
    parser.add_argument("--write-parameter", action="store_true", help="put the AMI id into that parameter when done")
    parser.add_argument("--name", metavar="NAME", help="the AMI's name (default: gpujobs-STACK-YYYYmmddTHHMMSSZ)")
    parser.add_argument(
        "--source-ami",
        metavar="ID",
        help="the AMI to start from (default: the one the stack's AmiParameter names now, which after a bake is "
        "the baked one: pass the base AMI to start afresh)",
    )
    parser.add_argument("--subnet", metavar="ID", help="the builder's subnet (default: the stack's first)")
    parser.add_argument(
        "--instance-type", metavar="TYPE", help="the builder's type (default: c7i.large, c7g.large on arm64)"
    )
    parser.add_argument(
        "--timeout", type=_minutes, default=60.0, metavar="MINUTES", help="longest wait for the pulls (default 60)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _minutes(value: str) -> float:
    try:
        minutes = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of minutes") from None
    if not 5 <= minutes <= 600:
        raise argparse.ArgumentTypeError("must be between 5 and 600 minutes")
    return minutes


def cmd_bake(args: argparse.Namespace) -> int:
    references = checked_references(args.images)
    name = args.name or f"gpujobs-{args.stack}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    if not AMI_NAME.match(name):
        raise CommandError(f"--name {name!r}: 3 to 128 letters, digits and ()[] ./-'@_ (EC2's rule for AMI names)")
    resources = Resources(stack=args.stack, region=args.region)
    target = read_target(resources.client, stack=args.stack, subnet=args.subnet, source_ami=args.source_ami)
    parameter = parameter_for(args.parameter, target)
    if args.write_parameter and parameter == target.ami_parameter:
        _refuse_an_owner_the_stack_does_not_allow(resources.client, target)
    if resources.client("ec2").describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [name]}])["Images"]:
        raise CommandError(f"an AMI named {name!r} exists already: pass --name")
    instance_type = args.instance_type or BUILDER_TYPES.get(target.architecture)
    if not instance_type:
        raise CommandError(f"no default builder type for {target.architecture}: pass --instance-type")
    baker = Baker(resources.client, clock=clock, sleep=sleep, say=_progress(clock()))
    try:
        baked = baker.bake(
            target,
            references=references,
            name=name,
            instance_type=instance_type,
            nonce=uuid.uuid4().hex,
            timeout_s=args.timeout * 60,
        )
    except BakeFailedError as exc:
        print(f"gpujobs: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.write_parameter:
        resources.client("ssm").put_parameter(
            Name=parameter, Value=baked.ami_id, Type="String", DataType="aws:ec2:image", Overwrite=True
        )
    steps = next_steps(target, baked, parameter=parameter, written=args.write_parameter)
    if args.json:
        print(
            json.dumps(
                _as_json(target, baked, parameter=parameter, written=args.write_parameter, steps=steps), indent=2
            )
        )
    else:
        print(render(target, baked, parameter=parameter, written=args.write_parameter, steps=steps))
    return EXIT_OK


def checked_references(given: list[str]) -> list[str]:
    """`given` without duplicates, each a plain image reference that fits an AMI tag; CommandError naming any other."""
    references = list(dict.fromkeys(given))
    bad = [r for r in references if images.parse(r) is None or len(r) > MAX_TAG_VALUE]
    if bad:
        shown = ", ".join(repr(r[:80]) for r in bad)
        raise CommandError(f"not a plain image reference (registry/repository:tag or @sha256:digest): {shown}")
    if len(references) > MAX_IMAGES:
        raise CommandError(f"at most {MAX_IMAGES} images per AMI")
    return references


def parameter_for(given: str | None, target: BakeTarget) -> str:
    """The SSM parameter the AMI id goes to: `given`, else the stack's own AmiParameter, else (a public
    /aws/ one, which nobody may write) /platform/gpujobs/STACK/ami. CommandError for a name not your own."""
    if given is None:
        public = target.ami_parameter.startswith("/aws/")
        return f"/platform/gpujobs/{target.stack}/ami" if public else target.ami_parameter
    if not PARAMETER_NAME.match(given) or given.startswith("/aws/"):
        raise CommandError(f"--parameter {given!r}: an SSM parameter name of your own, starting with '/' (not /aws/)")
    return given


def _refuse_an_owner_the_stack_does_not_allow(clients: Callable[[str], Any], target: BakeTarget) -> None:
    """Writing the stack's own parameter switches its next launch to the AMI: IAM must allow its owner first."""
    account = str(clients("sts").get_caller_identity()["Account"])
    if account not in target.allowed_owners:
        owners = ",".join([*target.allowed_owners, account])
        raise CommandError(
            f"the stack may launch AMIs of {','.join(target.allowed_owners)} only, and its launches would fail on "
            f"this account's: first `sam deploy --stack-name {target.stack} --parameter-overrides "
            f"AllowedAmiOwners={owners}`, then bake with --write-parameter (nothing was launched)"
        )


def next_steps(target: BakeTarget, baked: Baked, *, parameter: str, written: bool) -> list[str]:
    """The commands, in order, that make the stack launch `baked` (none when it does already)."""
    owners = list(target.allowed_owners)
    overrides = [] if parameter == target.ami_parameter else [f"AmiParameter={parameter}"]
    if baked.owner and baked.owner not in owners:
        overrides.append(f"AllowedAmiOwners={','.join([*owners, baked.owner])}")
    deploy = (
        [
            f"sam deploy --stack-name {shlex.quote(target.stack)} --parameter-overrides {' '.join(map(shlex.quote, overrides))}"
        ]
        if overrides
        else []
    )
    put = (
        []
        if written
        else [
            f"aws ssm put-parameter --name {shlex.quote(parameter)} --type String --data-type aws:ec2:image "
            f"--value {baked.ami_id} --overwrite"
        ]
    )
    # The stack's own parameter switches the next launch at once: the owner must be allowed before it.
    return [*deploy, *put] if parameter == target.ami_parameter else [*put, *deploy]


def render(target: BakeTarget, baked: Baked, *, parameter: str, written: bool, steps: list[str]) -> str:
    lines = [f"{baked.ami_id}  {baked.name}  (from {target.source_ami}, stack {target.stack})"]
    lines += [f"  {item['image']}  {pulled_in(item)}" for item in baked.pulled]
    if written:
        lines.append(f"{parameter} now holds {baked.ami_id}")
    if steps:
        lines.append("to use it:")
        lines += [f"  {step}" for step in steps]
    else:
        lines.append("the stack's next launches use it (EC2 reads AmiParameter at every launch)")
    return "\n".join(lines)


def _as_json(target: BakeTarget, baked: Baked, *, parameter: str, written: bool, steps: list[str]) -> dict[str, Any]:
    return {
        "ami_id": baked.ami_id,
        "name": baked.name,
        "stack": target.stack,
        "source_ami": target.source_ami,
        "images": baked.pulled,
        "snapshots": baked.snapshots,
        "builder_instance_id": baked.builder,
        "parameter": parameter,
        "parameter_written": written,
        "next_steps": steps,
    }


def _progress(started: float) -> Callable[[str], None]:
    def say(message: str) -> None:
        elapsed = clock() - started
        print(f"gpujobs bake: [{int(elapsed // 60):3d}:{int(elapsed % 60):02d}] {message}", file=sys.stderr, flush=True)

    return say
