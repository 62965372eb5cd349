"""Where the stack's queue and table are: CloudFormation outputs, unless the environment says.

The CLI needs little from a deployment: the jobs queue, the jobs table and the job log group. Reading
them from the stack's outputs means a user types `gpujobs list` and nothing else; the `GPUJOBS_*`
overrides exist for a stack deployed under other names and for local clouds without CloudFormation,
and when every resource a command needs is overridden, CloudFormation is not called at all.
boto3 is imported here, lazily, so that `validate` and `schema` start without it; the endpoint
(`AWS_ENDPOINT_URL`), region and credentials are boto3's own configuration chain.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_STACK = "gpujobs"

QUEUE, TABLE, EVENT_BUS, BUCKET = "queue", "table", "event_bus", "bucket"
LOG_GROUP, DASHBOARD, TEAMS_PARAMETER = "log_group", "dashboard", "teams_parameter"
SHELL_DOCUMENT, EXEC_DOCUMENT = "shell_document", "exec_document"
SPOT_DRILL_ROLE = "spot_drill_role"
_OUTPUT_KEYS = {
    QUEUE: "JobsQueueUrl",
    TABLE: "JobsTableName",
    EVENT_BUS: "EventBusName",
    BUCKET: "CheckpointBucketName",
    LOG_GROUP: "JobLogGroupName",
    DASHBOARD: "DashboardName",
    TEAMS_PARAMETER: "TeamsParameterName",
    SHELL_DOCUMENT: "ShellDocumentName",
    EXEC_DOCUMENT: "ExecDocumentName",
    SPOT_DRILL_ROLE: "SpotDrillRoleArn",
}
_ENV_OVERRIDES = {
    QUEUE: "GPUJOBS_QUEUE_URL",
    TABLE: "GPUJOBS_TABLE",
    EVENT_BUS: "GPUJOBS_EVENT_BUS",
    LOG_GROUP: "GPUJOBS_LOG_GROUP",
    BUCKET: "GPUJOBS_BUCKET",
    DASHBOARD: "GPUJOBS_DASHBOARD",
    TEAMS_PARAMETER: "GPUJOBS_TEAMS_PARAMETER",
    SHELL_DOCUMENT: "GPUJOBS_SHELL_DOCUMENT",
    EXEC_DOCUMENT: "GPUJOBS_EXEC_DOCUMENT",
    SPOT_DRILL_ROLE: "GPUJOBS_SPOT_DRILL_ROLE_ARN",
}
OVERRIDE_HINT = "set GPUJOBS_QUEUE_URL and GPUJOBS_TABLE to use a queue and table without a stack"


class ConfigError(Exception):
    """The CLI cannot find or reach what it needs; the message is one line for the user."""


@dataclass
class Resources:
    """The stack's resources as the CLI needs them, with boto3 clients created on first use."""

    stack: str
    region: str | None
    values: dict[str, str] = field(default_factory=dict)
    _session: Any = None
    _clients: dict[str, Any] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self._boto3_session().client(service)
        return self._clients[service]

    def _boto3_session(self) -> Any:
        if self._session is None:
            import boto3

            self._session = boto3.session.Session(region_name=self.region)
        return self._session

    @property
    def region_name(self) -> str:
        """The region boto3 resolves (--region, AWS_REGION, the profile); ConfigError when none."""
        region: str | None = self._boto3_session().region_name
        if not region:
            raise ConfigError("no AWS region configured: pass --region or set AWS_REGION")
        return region

    @property
    def queue_url(self) -> str:
        return self.values[QUEUE]

    @property
    def table_name(self) -> str:
        return self.values[TABLE]


def discover(
    *,
    stack: str,
    region: str | None,
    needs: Collection[str],
    env: Mapping[str, str] | None = None,
) -> Resources:
    """Resolve `needs` (QUEUE, TABLE, ...) from env overrides, then from the stack's outputs."""
    env = os.environ if env is None else env
    found = Resources(stack=stack, region=region)
    for name, variable in _ENV_OVERRIDES.items():
        if env.get(variable):
            found.values[name] = env[variable]
    missing = [n for n in needs if n not in found.values]
    if not missing:
        return found
    outputs = _stack_outputs(found)
    for name in missing:
        key = _OUTPUT_KEYS[name]
        if key not in outputs:
            raise ConfigError(f"stack {stack!r} has no output {key}; deploy the current template or {OVERRIDE_HINT}")
        found.values[name] = outputs[key]
    return found


def optional(resources: Resources, name: str) -> str | None:
    """A resource the stack may not name (an older stack, or one without teams): its override, its
    output, or None; never an error."""
    if name in resources.values:
        return resources.values[name] or None
    try:
        value = _stack_outputs(resources).get(_OUTPUT_KEYS[name])
    except ConfigError:
        value = None
    resources.values[name] = value or ""
    return value or None


def _stack_outputs(resources: Resources) -> dict[str, str]:
    from botocore.exceptions import ClientError

    cloudformation = resources.client("cloudformation")
    try:
        stacks = cloudformation.describe_stacks(StackName=resources.stack)["Stacks"]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "ValidationError" and "does not exist" in str(error.get("Message", "")):
            where = f" in {cloudformation.meta.region_name}"
            raise ConfigError(
                f"stack {resources.stack!r} not found{where}; pass --stack NAME (or GPUJOBS_STACK), or {OVERRIDE_HINT}"
            ) from None
        raise
    if not stacks:
        raise ConfigError(f"stack {resources.stack!r} not found; {OVERRIDE_HINT}")
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", []) if "OutputValue" in o}
