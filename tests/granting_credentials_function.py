"""The credentials function as an instance process sees it, for tests of the instance's side only: a
Lambda Invoke endpoint on loopback (`gpujobs_local.lambda_endpoint`) whose function grants every ask
the attempt's job-role session from a moto server's STS (session `gpujobs-<job>-a<attempt>`, as the
real one names it), recording who signed each proof (`signers`, as STS names them). What the real function checks before it grants is
tests/integration/test_job_sessions_are_vended_only_to_their_attempt.py's; the local cloud runs the
real handler behind the same endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from botocore import UNSIGNED
from botocore.config import Config

from gpujobs.adapters.sts_sessions import StsCallerIdentity
from gpujobs_local.lambda_endpoint import LambdaEndpoint

FUNCTION = "gpujobs-CredentialsFunction"


class GrantingCredentialsFunction:
    def __init__(self, moto_endpoint: str, *, role_arn: str, name: str = FUNCTION) -> None:
        self.name, self.role_arn = name, role_arn
        self.asks: list[dict[str, Any]] = []
        self.signers: list[str] = []
        """Who signed each ask's proof, as STS names them (the real function's `StsCallerIdentity`)."""
        self._sts: Any = boto3.client(
            "sts",
            endpoint_url=moto_endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        unsigned = boto3.client(
            "sts", endpoint_url=moto_endpoint, region_name="us-east-1", config=Config(signature_version=UNSIGNED)
        )
        self._identities = StsCallerIdentity(client=unsigned)

    def invoke(self, name: str, payload: bytes) -> bytes | None:
        if name.split(":function:", 1)[-1].split(":", 1)[0] != self.name:
            return None
        ask = json.loads(payload)
        self.asks.append(ask)
        self.signers.append(self._identities.caller_arn(headers=ask["headers"], body=ask["body"]))
        creds: dict[str, Any] = self._sts.assume_role(
            RoleArn=self.role_arn, RoleSessionName=f"gpujobs-{ask['job_id']}-a{ask['attempt']}", DurationSeconds=3600
        )["Credentials"]
        fields = ("AccessKeyId", "SecretAccessKey", "SessionToken")
        vended = {**{k: creds[k] for k in fields}, "Expiration": creds["Expiration"].isoformat()}
        return json.dumps({"credentials": vended}).encode()


@contextmanager
def granting_credentials_function(
    moto_endpoint: str, *, role_arn: str
) -> Iterator[tuple[str, GrantingCredentialsFunction]]:
    """(the endpoint for `AWS_ENDPOINT_URL_LAMBDA`, the function) while the block runs."""
    function = GrantingCredentialsFunction(moto_endpoint, role_arn=role_arn)
    with LambdaEndpoint(function.invoke) as endpoint:
        yield endpoint.endpoint, function
