"""Deployment settings, read once from the environment the template gives each function."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


class SettingsError(Exception):
    pass


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@dataclass(frozen=True)
class Settings:
    table_name: str
    event_bus_name: str
    checkpoint_bucket: str
    queue_url: str = ""
    launch_template_id: str = ""
    security_group_id: str = ""
    subnet_ids: tuple[str, ...] = ()
    allowed_instance_types: tuple[str, ...] = ()
    region: str = "us-east-1"
    stack_name: str = "gpujobs"
    checkpoint_document: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        missing = [k for k in ("JOBS_TABLE", "EVENT_BUS_NAME", "CHECKPOINT_BUCKET") if not env.get(k)]
        if missing:
            raise SettingsError(f"missing environment variables: {', '.join(missing)}")
        return cls(
            table_name=env["JOBS_TABLE"],
            event_bus_name=env["EVENT_BUS_NAME"],
            checkpoint_bucket=env["CHECKPOINT_BUCKET"],
            queue_url=env.get("JOBS_QUEUE_URL", ""),
            launch_template_id=env.get("LAUNCH_TEMPLATE_ID", ""),
            security_group_id=env.get("SECURITY_GROUP_ID", ""),
            subnet_ids=_split(env.get("SUBNET_IDS", "")),
            allowed_instance_types=_split(env.get("ALLOWED_INSTANCE_TYPES", "")),
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            stack_name=env.get("GPUJOBS_STACK_NAME", "gpujobs"),
            checkpoint_document=env.get("CHECKPOINT_DOCUMENT", ""),
        )
