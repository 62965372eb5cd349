"""What `validate` and `submit` check a spec's instance types against, with no AWS call.

The packaged catalog (`gpujobs.adapters.catalog`, generated from EC2's data) says which types exist
and how many GPUs each has. Where they are offered is checked only when the CLI knows a region
without asking AWS: `--region`, else `AWS_REGION`, else `AWS_DEFAULT_REGION` (a profile's region
would mean reading the AWS config, boto3's work, which `validate` never imports). Without one, a
spec is judged for every region alike, as a spec does not name one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TypedDict

from gpujobs.adapters.catalog import gpu_counts, packaged_offerings
from gpujobs.domain.offerings import RegionOfferings


class TypeChecks(TypedDict, total=False):
    """Keyword arguments of `load_spec` and `validate_spec`."""

    instance_gpus: Mapping[str, int]
    offered_in: tuple[str, RegionOfferings]


def offline_region(region: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The region given or configured in the environment, or None."""
    env = os.environ if env is None else env
    return region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None


def type_checks(region: str | None, env: Mapping[str, str] | None = None) -> TypeChecks:
    """The catalog's GPU counts, and where each type is offered when a region is known."""
    checks = TypeChecks(instance_gpus=gpu_counts())
    known = offline_region(region, env)
    if known:
        checks["offered_in"] = (known, packaged_offerings())
    return checks
