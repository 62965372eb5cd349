"""Per-job credentials: the attempt's job-role session, asked of the stack's credentials function.

Only the credentials function may assume the job role (template.yaml `JobRole`; the instance role
may not). The bootstrap invokes it with a proof of who it is: an `sts:GetCallerIdentity` request
signed with the instance role's credentials (SigV4, as Vault's AWS IAM auth and
aws-iam-authenticator do), whose signed `X-Gpujobs-Job-Session` header names the stack, job and
attempt it is for. The function has STS check the signature, reads the job's record, and mints the
session only for an instance the record lists in that live attempt, with the tags and session policy
it renders from the record (`gpujobs.domain.job_sessions`).

An answer is credentials, or a refusal with its reason. "Not yet" refusals (the launcher has not
recorded the instances yet) and failures to reach the function are asked again with backoff, a
bounded number of times; any other refusal is final. Both end in BootstrapError. Sessions last an
hour and are renewed when less than `REFRESH_MARGIN` is left as they are asked for, so the container
(whose SDK refreshes with 15 minutes left) is never handed credentials botocore would refetch on
every call. The host agent (`hostagent.py`) serves them.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from gpujobs.instance.aws import Clients, client, fresh_instance_session, session_keys
from gpujobs.instance.contract import JOB_SESSION_HEADER, job_session_purpose
from gpujobs.instance.errors import BootstrapError
from gpujobs.instance.log import log

REFRESH_MARGIN = dt.timedelta(minutes=20)
UTC = dt.timezone.utc  # not `dt.UTC`: that is Python 3.11+, and an AMI's python3 may be 3.9
IDENTITY_BODY = "Action=GetCallerIdentity&Version=2011-06-15"
RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0)
"""Seconds between asks while the answer is "not yet" or the function cannot be reached (one minute in all)."""
_FINAL_INVOKE_ERRORS = {"AccessDeniedException", "ResourceNotFoundException", "InvalidRequestContentException"}

Signer = Callable[[str], "dict[str, Any]"]
"""purpose -> the signed identity proof `{"headers": {...}, "body": "..."}`."""


def instance_identity_signer(region: str, credentials: dict[str, Any] | None = None) -> Signer:
    """Signs the proof with this instance's own credentials (the instance role, from IMDS; or
    `credentials`, an STS `Credentials`), for the STS endpoint its boto3 resolves in `region` (the
    credentials function's is the same)."""

    def sign(purpose: str) -> dict[str, Any]:
        import boto3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        if credentials is None:
            session = fresh_instance_session(region)
        else:
            session = boto3.Session(region_name=region, **session_keys(credentials))  # type: ignore[arg-type]  # the three key arguments, all str
        url = session.client("sts", region_name=region).meta.endpoint_url.rstrip("/") + "/"
        own = session.get_credentials()
        if own is None:
            raise BootstrapError("this instance has no credentials to prove who it is")
        headers = {
            "Host": url.split("://", 1)[-1].split("/", 1)[0],
            "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
            JOB_SESSION_HEADER: purpose,
        }
        request = AWSRequest(method="POST", url=url, data=IDENTITY_BODY, headers=headers)
        SigV4Auth(own.get_frozen_credentials(), "sts", region).add_auth(request)
        return {"headers": dict(request.headers.items()), "body": IDENTITY_BODY}

    return sign


class _AskAgainError(Exception):
    pass


class JobCredentials:
    """The attempt's job-role session, renewed on demand once less than `REFRESH_MARGIN` is left."""

    def __init__(
        self,
        lambda_client: Any,
        doc: dict[str, Any],
        *,
        sign: Signer,
        now: Callable[[], dt.datetime] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._lambda, self._sign, self._sleep = lambda_client, sign, sleep
        self._function = doc["credentials_function"]
        self._job_id, self._attempt = doc["job_id"], doc["attempt"]
        self._purpose = job_session_purpose(doc["stack"], doc["job_id"], doc["attempt"])
        self._now = now or (lambda: dt.datetime.now(UTC))
        self._lock = threading.Lock()
        self._current: dict[str, Any] | None = None

    def current(self) -> dict[str, Any]:
        """`{AccessKeyId, SecretAccessKey, SessionToken, Expiration}` with at least the margin left."""
        with self._lock:
            if self._current is None or self._current["Expiration"] - self._now() < REFRESH_MARGIN:
                self._current = self._vended()
            return dict(self._current)

    def _vended(self) -> dict[str, Any]:
        last = ""
        for delay in (*RETRY_DELAYS, None):
            try:
                return self._ask()
            except _AskAgainError as retry:
                last = str(retry)
            if delay is None:
                break
            log(f"job session not granted yet ({last}); asking again in {delay:g} s")
            self._sleep(delay)
        raise BootstrapError(f"cannot get the job's session: {last}")

    def _ask(self) -> dict[str, Any]:
        proof = self._sign(self._purpose)
        payload = {"job_id": self._job_id, "attempt": self._attempt, **proof}
        try:
            answer = self._lambda.invoke(
                FunctionName=self._function, InvocationType="RequestResponse", Payload=json.dumps(payload).encode()
            )
            body = json.loads(answer["Payload"].read() or b"null")
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code in _FINAL_INVOKE_ERRORS:
                raise BootstrapError(f"cannot ask {self._function} for the job's session: {exc}") from exc
            raise _AskAgainError(f"{self._function} unreachable: {exc}") from exc
        if answer.get("FunctionError") or not isinstance(body, dict):
            raise _AskAgainError(f"{self._function} failed ({answer.get('FunctionError') or 'no answer'})")
        if "credentials" in body:
            creds = dict(body["credentials"])
            creds["Expiration"] = dt.datetime.fromisoformat(creds["Expiration"])
            return creds
        reason = f"{body.get('refused', 'refused')}: {body.get('detail', '')}"
        if body.get("retryable"):
            raise _AskAgainError(reason)
        raise BootstrapError(f"the credentials function refused the job's session: {reason}")

    def served(self) -> dict[str, str]:
        """The container-credentials endpoint's body (Expiration in UTC, ending in Z)."""
        creds = self.current()
        return {
            "AccessKeyId": creds["AccessKeyId"],
            "SecretAccessKey": creds["SecretAccessKey"],
            "Token": creds["SessionToken"],
            "Expiration": creds["Expiration"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    def clients(self, region: str) -> Clients:
        """Clients acting as the job: the bootstrap's reads of its checkpoints and secrets."""
        return lambda service: client(service, region, credentials=self.current())
