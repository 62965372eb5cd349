"""What a deployment tells the launch about itself: the bucket, bus and region its run documents
name, the instance types it allows and can price, the job role and log group, and the hardware of
each type. Read once from the settings (`runtime.bootstrap.launch_config`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpujobs.domain.hardware import InstanceHardware


@dataclass(frozen=True)
class LaunchConfig:
    checkpoint_bucket: str
    event_bus_name: str
    region: str
    allowed_instance_types: tuple[str, ...] = ()
    priced_instance_types: frozenset[str] | None = None
    """Types with a known price; a spec with `max_cost_usd` over any other type is refused."""
    job_role_arn: str = ""
    """Named in every run document: the role the bootstrap assumes for the container (none: the instance's)."""
    credentials_function: str = ""
    """The function the bootstrap asks for its job session (`service.job_sessions`), named in every run document."""
    stack_name: str = ""
    """The stack whose credentials function a run document's identity proof is for."""
    job_log_group: str = ""
    hardware: Mapping[str, InstanceHardware] = field(default_factory=dict)
    """Each type's EFA interfaces and instance store (`adapters.catalog.packaged_hardware`); an unknown type has neither."""
