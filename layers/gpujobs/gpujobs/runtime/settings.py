"""Deployment settings, read once from the environment the template gives each function.

Every function needs the jobs table, the event bus and the stack's name. The rest depends on what
the function does (`Need`): each handler declares its needs at import, so a function deployed
without one fails its cold start with an error naming every missing variable, instead of failing a
job later. An absent and an empty variable are the same here: both are a deployment mistake.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum


class SettingsError(Exception):
    pass


EVERY_FUNCTION = ("JOBS_TABLE", "EVENT_BUS_NAME", "GPUJOBS_STACK_NAME")
"""Every function reads or writes jobs, publishes what changed, and knows which stack it belongs to."""


class Need(Enum):
    """What a function does beyond reading and writing jobs, and the variables that takes."""

    ADMIT = ("ALLOWED_INSTANCE_TYPES",)
    """Admits job specs: without the allow-list any instance type would be accepted."""
    LAUNCH = ("LAUNCH_TEMPLATE_ID", "SECURITY_GROUP_ID", "SUBNET_IDS", "CHECKPOINT_BUCKET", "REPORT_SECRET_ARN")
    """Launches instances: the template, network, the bucket the run document and checkpoints go to,
    and the secret each attempt's report key is derived from (also what verifies reports)."""
    SIGNAL = ("CHECKPOINT_DOCUMENT",)
    """Asks training containers to checkpoint now, through the stack's SSM document."""
    VEND = ("CHECKPOINT_BUCKET", "JOB_ROLE_ARN", "INSTANCE_ROLE_ARN")
    """Vends job sessions: the bucket the session policy names, the role it assumes, and the
    instance role whose sessions (and no other principal's) may ask for one."""


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(f"{name} must be a whole number of days, not {text!r}") from None
    if value < 1:
        raise SettingsError(f"{name} must be at least 1, not {value}")
    return value


@dataclass(frozen=True)
class Settings:
    table_name: str
    event_bus_name: str
    stack_name: str
    checkpoint_bucket: str = ""
    queue_url: str = ""
    launch_template_id: str = ""
    security_group_id: str = ""
    subnet_ids: tuple[str, ...] = ()
    allowed_instance_types: tuple[str, ...] = ()
    region: str = "us-east-1"
    checkpoint_document: str = ""
    teams_parameter: str = ""
    """SSM parameter holding the team configuration; empty: none (single-tenant, see domain.teams)."""
    report_secret_arn: str = ""
    report_secret_grace_hours: float = 168.0
    """How long after a rotation the report secret's previous version still verifies (`adapters.secrets`)."""
    job_role_arn: str = ""
    """The role the instances assume for each job's container (template.yaml `JobRole`)."""
    job_log_group: str = ""
    """The log group of jobs' output (template.yaml `JobLogGroup`); empty: output stays on the instances."""
    reports_function_name: str = ""
    """The Reports function, whose throttles the reconciler reads (`domain.hangs`); empty: not read."""
    instance_role_arn: str = ""
    """The instances' role (template.yaml `InstanceRole`): only its sessions may ask for a job session."""
    credentials_function: str = ""
    """The function instances ask for their job session (template.yaml `CredentialsFunction`)."""
    checkpoint_retention_days: int = 30
    """Days an ended job's objects are kept (template.yaml `CheckpointRetentionDays`, `domain.retention`)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, needs: Iterable[Need] = ()) -> Settings:
        """The settings in `env`; SettingsError naming every missing variable that `needs` require."""
        env = os.environ if env is None else env
        required = dict.fromkeys([*EVERY_FUNCTION, *(name for need in needs for name in need.value)])
        missing = [name for name in required if not env.get(name, "").strip()]
        if missing:
            raise SettingsError(f"missing environment variables: {', '.join(missing)}")
        return cls(
            table_name=env["JOBS_TABLE"],
            event_bus_name=env["EVENT_BUS_NAME"],
            stack_name=env["GPUJOBS_STACK_NAME"],
            checkpoint_bucket=env.get("CHECKPOINT_BUCKET", ""),
            queue_url=env.get("JOBS_QUEUE_URL", ""),
            launch_template_id=env.get("LAUNCH_TEMPLATE_ID", ""),
            security_group_id=env.get("SECURITY_GROUP_ID", ""),
            subnet_ids=_split(env.get("SUBNET_IDS", "")),
            allowed_instance_types=_split(env.get("ALLOWED_INSTANCE_TYPES", "")),
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            checkpoint_document=env.get("CHECKPOINT_DOCUMENT", ""),
            teams_parameter=env.get("TEAMS_PARAMETER", "").strip(),
            report_secret_arn=env.get("REPORT_SECRET_ARN", ""),
            report_secret_grace_hours=float(env.get("REPORT_SECRET_GRACE_HOURS", "") or 168.0),
            job_role_arn=env.get("JOB_ROLE_ARN", ""),
            job_log_group=env.get("JOB_LOG_GROUP", ""),
            reports_function_name=env.get("REPORTS_FUNCTION_NAME", "").strip(),
            instance_role_arn=env.get("INSTANCE_ROLE_ARN", "").strip(),
            credentials_function=env.get("CREDENTIALS_FUNCTION", "").strip(),
            checkpoint_retention_days=_positive_int(env, "CHECKPOINT_RETENTION_DAYS", 30),
        )
