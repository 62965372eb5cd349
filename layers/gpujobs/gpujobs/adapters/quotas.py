"""Service Quotas behind the ServiceQuotas port: the value of an EC2 vCPU quota a launch ran into.

Read only when a quota has refused a launch, to put its value in the job's status. A status that
cannot say the value says so: any error (refused, throttled, an unknown code) answers None and is
logged, never raised, because the launch's outcome does not depend on it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

log = logging.getLogger(__name__)


class ServiceQuotasClient(Protocol):
    """The one call of boto3's `service-quotas` client this adapter makes (no typed stubs are installed)."""

    def get_service_quota(self, *, ServiceCode: str, QuotaCode: str) -> Mapping[str, Any]: ...  # noqa: N803


SERVICE_CODE = "ec2"
"""The vCPU quotas' service (`domain.quotas` names them); kept here so no cold start loads the domain's table."""


class Ec2ServiceQuotas:
    def __init__(self, *, client: ServiceQuotasClient) -> None:
        self._client = client

    def current_value(self, quota_code: str) -> float | None:
        try:
            quota = self._client.get_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=quota_code)["Quota"]
            return float(quota["Value"])
        except Exception:
            log.warning("could not read quota %s of %s", quota_code, SERVICE_CODE, exc_info=True)
            return None
