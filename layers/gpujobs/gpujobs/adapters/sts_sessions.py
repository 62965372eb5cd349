"""STS for the credentials function: who signed a proof, and the job role's sessions.

`StsCallerIdentity` sends the instance's signed `GetCallerIdentity` (its headers and body, exactly as
signed) to this function's own STS endpoint, the one an unsigned boto3 client of the function
resolves (regional; the local cloud's moto server when `AWS_ENDPOINT_URL` names one), never to a URL
the caller chose. It goes through botocore, so retries, timeouts and a mock (moto) apply as to any
call: the client signs nothing itself, and a `request-created` hook puts the instance's headers and
body on the request. STS checks the signature; its 4xx answers mean the proof is not good
(IdentityRejectedError), anything else is transient and propagates.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from gpujobs.service.job_sessions import IdentityRejectedError

if TYPE_CHECKING:
    from types_boto3_sts import STSClient

_TRANSIENT_CODES = {
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "ServiceUnavailable",
    "InternalFailure",
}


class StsCallerIdentity:
    """`service.job_sessions.CallerIdentities` on an unsigned STS client (`Config(signature_version=UNSIGNED)`)."""

    def __init__(self, *, client: STSClient) -> None:
        self._sts = client
        self._forwarding: dict[str, Any] = {}

    @functools.cached_property
    def _hooked(self) -> STSClient:
        self._sts.meta.events.register("request-created.sts.GetCallerIdentity", self._put_proof_on)
        return self._sts

    @property
    def host(self) -> str:
        return urlsplit(self._sts.meta.endpoint_url).netloc

    def _put_proof_on(self, request: Any, **_: Any) -> None:
        proof = self._forwarding
        for name in list(request.headers.keys()):
            del request.headers[name]
        for name, value in proof["headers"].items():
            request.headers[name] = value
        request.data = proof["body"].encode()

    def caller_arn(self, *, headers: Mapping[str, str], body: str) -> str:
        sts = self._hooked
        self._forwarding = {"headers": dict(headers), "body": body}
        try:
            answer = sts.get_caller_identity()
        except ClientError as exc:
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if error.get("Code") in _TRANSIENT_CODES or not 400 <= status < 500:
                raise
            raise IdentityRejectedError(f"{error.get('Code', 'refused')}: {error.get('Message', '')}") from exc
        finally:
            self._forwarding = {}
        arn = answer.get("Arn", "")
        if not arn:
            raise IdentityRejectedError("STS answered without an Arn")
        return arn


class StsJobRoleSessions:
    def __init__(self, *, client: STSClient, role_arn: str) -> None:
        self._sts = client
        self._role_arn = role_arn

    def assume(self, *, session_name: str, policy: str, tags: Mapping[str, str], seconds: int) -> dict[str, Any]:
        answer = self._sts.assume_role(
            RoleArn=self._role_arn,
            RoleSessionName=session_name,
            DurationSeconds=seconds,
            Policy=policy,
            Tags=[{"Key": k, "Value": v} for k, v in sorted(tags.items())],
        )
        return dict(answer["Credentials"])
