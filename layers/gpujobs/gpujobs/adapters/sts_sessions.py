"""STS for the credentials function: who signed a proof, and the job role's sessions.

`StsCallerIdentity` sends the instance's signed `GetCallerIdentity` (its headers and body, as signed)
to this function's own STS endpoint, the one its boto3 client resolves (regional; the local cloud's
moto server when `AWS_ENDPOINT_URL` names one), never to a URL the caller chose. STS checks the
signature; a 4xx answer means the proof is not good (IdentityRejectedError), anything else is
transient. The answer is STS's own XML (over HTTPS from AWS), read for its `Arn`.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from xml.etree import ElementTree

from gpujobs.service.job_sessions import IdentityRejectedError

if TYPE_CHECKING:
    from types_boto3_sts import STSClient

_NOT_FORWARDED = {"content-length", "connection", "transfer-encoding", "expect"}
"""Hop-by-hop or computed headers: urllib sets them from the body itself."""


class StsCallerIdentity:
    def __init__(self, *, endpoint_url: str, timeout: float = 5.0) -> None:
        self._url = endpoint_url.rstrip("/") + "/"
        self._timeout = timeout

    @property
    def host(self) -> str:
        return urlsplit(self._url).netloc

    def caller_arn(self, *, headers: Mapping[str, str], body: str) -> str:
        sent = {k: v for k, v in headers.items() if k.lower() not in _NOT_FORWARDED}
        request = urllib.request.Request(self._url, data=body.encode(), headers=sent, method="POST")  # noqa: S310 (our own https endpoint)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as answer:  # noqa: S310 (as above)
                text = answer.read()
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500 and exc.code != 429:
                raise IdentityRejectedError(f"HTTP {exc.code} {_error_code(exc.read())}") from exc
            raise
        arn = _element(text, "Arn")
        if not arn:
            raise IdentityRejectedError("STS answered without an Arn")
        return arn


def _element(text: bytes, name: str) -> str:
    try:
        root = ElementTree.fromstring(text)  # noqa: S314 (STS's own answer, not the caller's input)
    except ElementTree.ParseError:
        return ""
    found = next((e.text for e in root.iter() if e.tag.rsplit("}", 1)[-1] == name), None)
    return (found or "").strip()


def _error_code(text: bytes) -> str:
    return _element(text, "Code") or "(no error code)"


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
