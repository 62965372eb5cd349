"""EC2 placement groups for moto, which implements none of them (moto 5.2.5 raises NotImplementedError).

Answered through botocore hooks on every client the code under test creates, as EC2 answers them:
CreatePlacementGroup keeps the group's tags, refuses a taken name (`InvalidPlacementGroup.Duplicate`)
and a 501st group (`PlacementGroupLimitExceeded`: 500 per Region, which moto would not enforce
either); DescribePlacementGroups filters by `group-name`, `state` and `tag:<key>`;
DeletePlacementGroup refuses a group an unterminated instance was launched into
(`InvalidPlacementGroup.InUse`) and an unknown one (`InvalidPlacementGroup.Unknown`); RunInstances
into a group that does not exist is refused too. `most_at_once` is the high-water mark, for tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import boto3
from botocore.awsrequest import AWSResponse

if TYPE_CHECKING:
    from botocore.compat import HTTPHeaders

REGION_LIMIT = 500
_URL = "https://ec2.amazonaws.com/"
_CONTEXT_KEY = "gpujobs_local_placement_group"
PARAMS_KEY = "gpujobs_local_params"
"""Where `keep_params` leaves a request's API parameters for the before-call hooks."""

Hook = Callable[..., Any]


@dataclass
class _Group:
    name: str
    tags: dict[str, str]
    instance_ids: set[str] = field(default_factory=set)


@dataclass
class PlacementGroups:
    region: str
    limit: int = REGION_LIMIT
    groups: dict[str, _Group] = field(default_factory=dict)
    most_at_once: int = 0
    _ec2: Any = None

    def install(self, register: Callable[[str, Hook], None]) -> None:
        # before-call sees the serialized request; the API parameters are kept for it here.
        for operation in ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup", "RunInstances"):
            register(f"before-parameter-build.ec2.{operation}", keep_params)
        register("before-call.ec2.CreatePlacementGroup", self._create)
        register("before-call.ec2.DescribePlacementGroups", self._describe)
        register("before-call.ec2.DeletePlacementGroup", self._delete)
        register("before-call.ec2.RunInstances", self._check_launch)
        register("after-call.ec2.RunInstances", self._note_launched)

    # ---- hooks -----------------------------------------------------------------------------
    def _create(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        params = context[PARAMS_KEY]
        name = params["GroupName"]
        if name in self.groups:
            return _error("InvalidPlacementGroup.Duplicate", f"The placement group '{name}' already exists.")
        if len(self.groups) >= self.limit:
            return _error("PlacementGroupLimitExceeded", "You've reached the limit of placement groups.")
        tags = {
            t["Key"]: t["Value"]
            for spec in params.get("TagSpecifications", [])
            if spec.get("ResourceType") == "placement-group"
            for t in spec.get("Tags", [])
        }
        self.groups[name] = _Group(name, tags)
        self.most_at_once = max(self.most_at_once, len(self.groups))
        return ok({"PlacementGroup": self._described(self.groups[name])})

    def _describe(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        params = context[PARAMS_KEY]
        found = [self._described(g) for g in self.groups.values() if _matches(g, params.get("Filters", []))]
        return ok({"PlacementGroups": found})

    def _delete(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        params = context[PARAMS_KEY]
        name = params["GroupName"]
        group = self.groups.get(name)
        if group is None:
            return _error("InvalidPlacementGroup.Unknown", f"The placement group '{name}' is unknown.")
        if self._unterminated(group.instance_ids):
            return _error("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use.")
        del self.groups[name]
        return ok({})

    def _check_launch(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        name = context[PARAMS_KEY].get("Placement", {}).get("GroupName")
        if not name:
            return None
        if name not in self.groups:
            return _error("InvalidPlacementGroup.Unknown", f"The placement group '{name}' is unknown.")
        context[_CONTEXT_KEY] = name
        return None

    def _note_launched(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        name = context.get(_CONTEXT_KEY)
        if name in self.groups:
            self.groups[name].instance_ids.update(i["InstanceId"] for i in parsed.get("Instances", []))

    # ---- helpers ---------------------------------------------------------------------------
    def _unterminated(self, instance_ids: set[str]) -> bool:
        if not instance_ids:
            return False
        if self._ec2 is None:
            self._ec2 = boto3.client("ec2", region_name=self.region)
        # A filter, not InstanceIds: EC2 forgets a terminated instance after about an hour.
        filters = [{"Name": "instance-id", "Values": sorted(instance_ids)}]
        reservations = self._ec2.describe_instances(Filters=filters)["Reservations"]
        return any(i["State"]["Name"] != "terminated" for r in reservations for i in r["Instances"])

    @staticmethod
    def _described(group: _Group) -> dict[str, Any]:
        return {
            "GroupName": group.name,
            "State": "available",
            "Strategy": "cluster",
            "Tags": [{"Key": k, "Value": v} for k, v in group.tags.items()],
        }


def keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    context[PARAMS_KEY] = params


def _matches(group: _Group, filters: list[dict[str, Any]]) -> bool:
    for f in filters:
        name, values = f["Name"], f["Values"]
        if name == "group-name" and group.name not in values:
            return False
        if name == "state" and "available" not in values:
            return False
        if name.startswith("tag:") and group.tags.get(name[4:]) not in values:
            return False
    return True


def _headers() -> HTTPHeaders:
    # The stubs want HTTPHeaders; AWSResponse wraps any mapping in a HeadersDict.
    return cast("HTTPHeaders", {})


def ok(body: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
    return AWSResponse(_URL, 200, _headers(), None), {**body, "ResponseMetadata": {"HTTPStatusCode": 200}}


def _error(code: str, message: str) -> tuple[AWSResponse, dict[str, Any]]:
    return AWSResponse(_URL, 400, _headers(), None), {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
