"""Baking an AMI that holds a stack's training images: the AWS side of `gpujobs bake`.

`read_target` reads what the stack says a training instance is (its AmiParameter and the AMI it
names now, subnets, instance profile, security group, root volume size and EBS key); `Baker.bake`
launches one builder instance from that AMI with that profile (the stack's InstanceRole, which may
pull from exactly the registries jobs may pull from), waits for it to pull the images and stop
(`bake_builder.py` runs on it), makes the AMI from its stopped volume, tags the AMI and its
snapshots as the stack's, and terminates the builder whatever happened.

The builder is launched as a training instance is: IMDSv2 required, no public IP, no SSH key, an
encrypted gp3 root volume (the stack's EBS key when it has one) of the stack's RootVolumeGiB (so the
launch template's mapping still fits the AMI), the stack's security group (egress only), tagged
`gpujobs:stack` (it has no `gpujobs:job-id` tag, so the reconciler never takes it for an orphan).
Its shutdown behaviour is `stop`: the AMI is made from the volume as the builder left it.

Every wait goes through the injected `clock` and `sleep`, so tests never sleep.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpujobs.contract import LIVE_STATES, NAME_TAG, STACK_TAG
from gpujobs.domain.spec_errors import printable
from gpujobs.instance import images
from gpujobs_cli import bake_builder
from gpujobs_cli.resources import ConfigError

Clients = Callable[[str], Any]
BUILDER_TYPES = {"x86_64": "c7i.large", "arm64": "c7g.large"}
"""The default builder per architecture: pulling needs network and disk, not a GPU."""
BAKED_FROM_TAG = "gpujobs:baked-from"
IMAGE_TAG = "gpujobs:image-{n}"
DIGEST_TAG = "gpujobs:image-{n}-digest"
MAX_USER_DATA_BYTES = 16384
HEREDOC = "GPUJOBS_BAKE_EOF"
REPORT_GRACE_SECONDS = 300.0
"""How long after the builder stopped its report may take to reach the console output."""
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REPORT = re.compile(rf"{bake_builder.REPORT_PREFIX} (ok|failed) ([0-9a-f]+) ([A-Za-z0-9+/=]*)")
_SHELL = f"""#!/bin/bash
# gpujobs bake builder: the program below pulls the images named in its last line's data (base64
# JSON, never parsed by a shell), reports on the console and powers off. The shell expands nothing.
exec >>/var/log/gpujobs-bake.log 2>&1
exec python3 - <<'{HEREDOC}'
"""


class BakeFailedError(Exception):
    """The builder did not produce what an AMI needs (it said so, stopped silently, or ran out of time)."""


@dataclass(frozen=True)
class BakeTarget:
    """What the stack says a training instance is, as far as a builder must match it."""

    stack: str
    ami_parameter: str
    source_ami: str
    architecture: str
    root_device: str
    volume_gib: int
    kms_key: str
    subnet: str
    security_group: str
    instance_profile: str
    allowed_owners: tuple[str, ...]


@dataclass
class Baked:
    """A finished bake: the AMI, what the builder pulled, and the builder (terminated)."""

    ami_id: str
    name: str
    owner: str
    builder: str
    pulled: list[dict[str, Any]] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)


def read_target(
    clients: Clients, *, stack: str, subnet: str | None = None, source_ami: str | None = None
) -> BakeTarget:
    """The stack's parameters, its instance profile and security group, and the AMI to start from:
    `source_ami`, else the one its AmiParameter names now."""
    from botocore.exceptions import ClientError

    cloudformation = clients("cloudformation")
    try:
        (described,) = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        if "does not exist" in str(exc):
            raise ConfigError(f"stack {stack!r} not found; pass --stack NAME (or GPUJOBS_STACK)") from None
        raise
    parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in described.get("Parameters", [])}
    missing = [k for k in ("AmiParameter", "SubnetIds") if not parameters.get(k)]
    if missing:
        raise ConfigError(f"stack {stack!r} has no {', '.join(missing)} parameter: deploy the current template")

    def resource(logical_id: str) -> str:
        answer = cloudformation.describe_stack_resource(StackName=stack, LogicalResourceId=logical_id)
        return str(answer["StackResourceDetail"]["PhysicalResourceId"])

    source = source_ami or clients("ssm").get_parameter(Name=parameters["AmiParameter"])["Parameter"]["Value"]
    (image,) = clients("ec2").describe_images(ImageIds=[source])["Images"]
    root = image.get("RootDeviceName", "/dev/sda1")
    root_sizes = [m["Ebs"].get("VolumeSize", 0) for m in image.get("BlockDeviceMappings", []) if "Ebs" in m]
    return BakeTarget(
        stack=stack,
        ami_parameter=parameters["AmiParameter"],
        source_ami=source,
        architecture=image.get("Architecture", "x86_64"),
        root_device=root,
        volume_gib=max([int(parameters.get("RootVolumeGiB") or 200), *root_sizes]),
        kms_key=parameters.get("EbsKmsKeyArn", ""),
        subnet=subnet or parameters["SubnetIds"].split(",")[0].strip(),
        security_group=resource("InstanceSecurityGroup"),
        instance_profile=resource("InstanceProfile"),
        allowed_owners=tuple(o.strip() for o in parameters.get("AllowedAmiOwners", "amazon").split(",") if o.strip()),
    )


def builder_user_data(references: list[str], *, nonce: str, deadline_minutes: int) -> str:
    """The builder's user data: fixed shell lines, `bake_builder.py` as it is, and one call of its
    `main` whose only argument is the bake's data as base64 JSON (nothing a shell or Python parses
    as code). `references` must already be plain image references (`images.parse`)."""
    data = json.dumps(
        {"nonce": nonce, "images": references, "deadline_minutes": deadline_minutes}, separators=(",", ":")
    )
    encoded = base64.b64encode(data.encode("utf-8")).decode("ascii")
    program = Path(bake_builder.__file__).read_text(encoding="utf-8")
    user_data = f'{_SHELL}{program}\nsys.exit(main("{encoded}"))\n{HEREDOC}\n'
    if len(user_data.encode("utf-8")) > MAX_USER_DATA_BYTES:
        raise ConfigError(
            f"too many or too long image references for one builder's user data ({MAX_USER_DATA_BYTES} bytes)"
        )
    return user_data


def read_report(console: str, nonce: str) -> tuple[str, str] | None:
    """The builder's report in its console output: ("ok", JSON of what it pulled) or ("failed", why); None before it."""
    found = [m for m in _REPORT.finditer(console) if m.group(2) == nonce]
    if not found:
        return None
    status, payload = found[-1].group(1), found[-1].group(3)
    return status, base64.b64decode(payload).decode("utf-8", "replace")


class Baker:
    """One bake with `clients(service)`, waiting on `clock` and `sleep`, telling `say` how it goes."""

    def __init__(
        self,
        clients: Clients,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        say: Callable[[str], None],
        poll_seconds: float = 15.0,
    ) -> None:
        self.clients, self.clock, self.sleep, self.say = clients, clock, sleep, say
        self.poll_seconds = poll_seconds

    def bake(
        self, target: BakeTarget, *, references: list[str], name: str, instance_type: str, nonce: str, timeout_s: float
    ) -> Baked:
        """Launch the builder, wait for it, make and tag the AMI; the builder is terminated whatever happens."""
        ec2 = self.clients("ec2")
        deadline = self.clock() + timeout_s
        user_data = builder_user_data(references, nonce=nonce, deadline_minutes=int(timeout_s // 60) + 10)
        tags = [{"Key": STACK_TAG, "Value": target.stack}]
        ebs: dict[str, Any] = {"VolumeSize": target.volume_gib, "VolumeType": "gp3", "Encrypted": True}
        ebs.update({"DeleteOnTermination": True, **({"KmsKeyId": target.kms_key} if target.kms_key else {})})
        launched = ec2.run_instances(
            ImageId=target.source_ami,
            InstanceType=instance_type,
            MinCount=1,
            MaxCount=1,
            ClientToken=nonce,
            IamInstanceProfile={"Name": target.instance_profile},
            MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
            NetworkInterfaces=[
                {
                    "DeviceIndex": 0,
                    "SubnetId": target.subnet,
                    "Groups": [target.security_group],
                    "AssociatePublicIpAddress": False,
                    "DeleteOnTermination": True,
                }
            ],
            BlockDeviceMappings=[{"DeviceName": target.root_device, "Ebs": ebs}],
            InstanceInitiatedShutdownBehavior="stop",
            UserData=user_data,
            TagSpecifications=[
                {
                    "ResourceType": kind,
                    "Tags": [*tags, {"Key": NAME_TAG, "Value": f"gpujobs-{target.stack}-ami-builder"}],
                }
                for kind in ("instance", "volume", "network-interface")
            ],
        )
        builder = launched["Instances"][0]["InstanceId"]
        self.say(f"launched builder {builder} ({instance_type}) from {target.source_ami} in {target.subnet}")
        try:
            pulled = self._wait_for_builder(builder, nonce=nonce, deadline=deadline, references=references)
            for item in pulled:
                self.say(f"{item['image']} {pulled_in(item)}")
            image_tags = [*tags, {"Key": NAME_TAG, "Value": name}, {"Key": BAKED_FROM_TAG, "Value": target.source_ami}]
            for n, item in enumerate(pulled, start=1):
                image_tags.append({"Key": IMAGE_TAG.format(n=n), "Value": item["image"]})
                digest = _digest_of(item)
                if digest:
                    image_tags.append({"Key": DIGEST_TAG.format(n=n), "Value": digest})
            made = ec2.create_image(
                InstanceId=builder,
                Name=name,
                Description=f"gpujobs bake of stack {target.stack} from {target.source_ami}: {len(references)} image(s)",
                TagSpecifications=[{"ResourceType": "image", "Tags": image_tags}],
            )
            ami = made["ImageId"]
            self.say(f"creating {ami} ({name}) from the builder's volume")
            described = self._wait_for_image(ami, deadline=self.clock() + max(timeout_s, 3600.0))
            snapshots = [
                m["Ebs"]["SnapshotId"]
                for m in described.get("BlockDeviceMappings", [])
                if "SnapshotId" in m.get("Ebs", {})
            ]
            if snapshots:  # billed too; tagged once their ids are known (moto takes no snapshot tags in CreateImage)
                ec2.create_tags(Resources=snapshots, Tags=[*tags, {"Key": NAME_TAG, "Value": name}])
            self.say(f"{ami} is available")
            return Baked(ami, name, str(described.get("OwnerId", "")), builder, pulled, snapshots)
        finally:
            ec2.terminate_instances(InstanceIds=[builder])
            self.say(f"terminated builder {builder}")

    def _wait_for_builder(
        self, builder: str, *, nonce: str, deadline: float, references: list[str]
    ) -> list[dict[str, Any]]:
        """Until the builder has stopped and reported; what it pulled. BakeFailedError otherwise."""
        ec2, last, told = self.clients("ec2"), "", self.clock()
        while True:
            reservations = self._described(lambda: ec2.describe_instances(InstanceIds=[builder])["Reservations"])
            instance: dict[str, Any] = (
                reservations[0]["Instances"][0] if reservations else {"State": {"Name": "pending"}}
            )
            state = instance["State"]["Name"]
            now = self.clock()
            if state != last or now - told >= 60:
                doing = f"running: booting, then pulling {len(references)} image(s)" if state == "running" else state
                self.say(f"builder {builder} {doing}")
                last, told = state, now
            if state == "stopped":
                return what_was_pulled(self._report(builder, nonce=nonce), references)
            if state not in LIVE_STATES:  # shutting down or terminated: not by its own power-off
                reason = instance.get("StateReason", {}).get("Message", state)
                raise BakeFailedError(f"the builder {builder} ended before it finished: {reason}")
            if now >= deadline:
                raise BakeFailedError(
                    f"the builder {builder} did not finish in time ({state}); "
                    f"its console output: aws ec2 get-console-output --instance-id {builder} --latest"
                )
            self.sleep(self.poll_seconds)

    def _report(self, builder: str, *, nonce: str) -> str:
        ec2 = self.clients("ec2")
        give_up = self.clock() + REPORT_GRACE_SECONDS
        while True:
            report = read_report(ec2.get_console_output(InstanceId=builder, Latest=True).get("Output") or "", nonce)
            if report is not None:
                status, payload = report
                if status == "failed":
                    raise BakeFailedError(f"the builder {builder} failed: {printable(payload)[:600]}")
                return payload
            if self.clock() >= give_up:
                raise BakeFailedError(
                    f"the builder {builder} stopped without reporting on its console; no AMI was made "
                    "(its log, /var/log/gpujobs-bake.log, went with it)"
                )
            self.sleep(self.poll_seconds)

    @staticmethod
    def _described(describe: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """`describe()`, or nothing yet: EC2 may not know an instance or image it has just returned (its
        reads are eventually consistent), and answers NotFound for a moment."""
        from botocore.exceptions import ClientError

        try:
            return describe()
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")).endswith(".NotFound"):
                return []
            raise

    def _wait_for_image(self, ami: str, *, deadline: float) -> dict[str, Any]:
        ec2 = self.clients("ec2")
        while True:
            found = self._described(lambda: ec2.describe_images(ImageIds=[ami])["Images"])
            state = found[0]["State"] if found else "pending"
            if state == "available":
                image: dict[str, Any] = found[0]
                return image
            if state not in ("pending", "transient"):
                reason = found[0].get("StateReason", {}).get("Message", state) if found else state
                raise BakeFailedError(f"{ami} is {state}: {reason}")
            if self.clock() >= deadline:
                raise BakeFailedError(f"{ami} is still {state}; it may yet become available (aws ec2 describe-images)")
            self.sleep(self.poll_seconds)


def what_was_pulled(report: str, references: list[str]) -> list[dict[str, Any]]:
    """The builder's account of its pulls, believed only as far as it matches what it was asked (it
    comes from an instance, and reaches a terminal and the AMI's tags): each reference once, in
    order, with the `name@sha256:...` digests docker recorded under its own name and the seconds
    the pull took. BakeFailedError when a reference is missing or the report is unreadable."""
    try:
        listed = json.loads(report)
    except ValueError:
        raise BakeFailedError("the builder's report is not JSON: no AMI was made") from None
    items = {i.get("image"): i for i in listed if isinstance(i, dict)} if isinstance(listed, list) else {}
    pulled: list[dict[str, Any]] = []
    for reference in references:
        item, ref = items.get(reference), images.parse(reference)
        if item is None or ref is None:
            raise BakeFailedError(f"the builder's report does not name {reference}: no AMI was made")
        seconds = item.get("seconds")
        held = images.repo_digests(json.dumps(item.get("digests")), ref.name)
        pulled.append(
            {
                "image": reference,
                "digests": [f"{ref.name}@{d}" for d in sorted(held) if _DIGEST.match(d)],
                "seconds": round(float(seconds), 1) if isinstance(seconds, int | float) else None,
            }
        )
    return pulled


def pulled_in(item: dict[str, Any]) -> str:
    """How one pull is told: `pulled in 262.4s`, or `pulled` when the builder gave no time."""
    return "pulled" if item.get("seconds") is None else f"pulled in {item['seconds']}s"


def _digest_of(item: dict[str, Any]) -> str:
    """The digest docker recorded for the image under its own name ("" when it recorded none)."""
    ref = images.parse(str(item["image"]))
    held = images.repo_digests(json.dumps(item.get("digests") or []), ref.name) if ref else set()
    return min(held) if held else ""
