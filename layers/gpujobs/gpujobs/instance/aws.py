"""AWS clients for the bootstrap: boto3 is imported late, only once a client is needed.

boto3 is the one dependency outside the stdlib (the shell part of the user data makes sure the
instance's Python has it). Importing it late keeps every other module importable without it: the
launch Lambda reads user data with `rundoc`, and tests import the modules one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Clients = Callable[[str], Any]
"""AWS service name -> boto3 client, in the region the job runs in."""

METADATA_SERVICE_TIMEOUT = 5
"""Seconds one request for the instance's own credentials may take (botocore's default: 1)."""
METADATA_SERVICE_ATTEMPTS = 6
"""Tries at them (botocore's default: 1). Right after a launch IMDS may answer slowly or not yet
serve the instance profile, and with one 1-second try the bootstrap's first call (the rendezvous'
DescribeInstances) failed with NoCredentialsError: seen on a loaded host, whose IMDS answered late."""


def session_keys(credentials: dict[str, Any] | None) -> dict[str, str]:
    """boto3's keyword arguments for `credentials` (an STS `Credentials`); none for the instance's own."""
    if credentials is None:
        return {}
    return {
        "aws_access_key_id": credentials["AccessKeyId"],
        "aws_secret_access_key": credentials["SecretAccessKey"],
        "aws_session_token": credentials["SessionToken"],
    }


def client(service: str, region: str, *, credentials: dict[str, Any] | None = None) -> Any:
    """A client with the instance's own credentials, or with `credentials` (an STS `Credentials`)."""
    import boto3

    if credentials is not None:
        keys = session_keys(credentials)
        return boto3.client(service, region_name=region, **keys)  # type: ignore[call-overload]  # the name is a plain str here
    return instance_session().client(service, region_name=region)


def instance_session() -> Any:
    """boto3's default session, on the instance's own credentials (the instance profile's, from IMDS,
    or the environment's), made patient with IMDS (`patient`). The default one: the bootstrap owns
    its process, and the local cloud's hooks on it (its Lambda endpoint) apply as before."""
    import boto3

    if boto3.DEFAULT_SESSION is None:
        boto3.setup_default_session()
    session = boto3.DEFAULT_SESSION
    assert session is not None
    patient(session._session)  # the botocore session under it
    return session


def fresh_instance_session(region: str) -> Any:
    """A new boto3 session on the instance's own credentials, resolved now (the identity proof's), patient with IMDS."""
    import boto3
    import botocore.session

    return boto3.Session(botocore_session=patient(botocore.session.get_session()), region_name=region)


def patient(core: Any) -> Any:
    """`core` (a botocore session) waiting for IMDS longer than botocore's defaults:
    `METADATA_SERVICE_TIMEOUT`, `METADATA_SERVICE_ATTEMPTS`, or what AWS_METADATA_SERVICE_TIMEOUT
    and _NUM_ATTEMPTS ask where that is more."""
    for name, least in (
        ("metadata_service_timeout", METADATA_SERVICE_TIMEOUT),
        ("metadata_service_num_attempts", METADATA_SERVICE_ATTEMPTS),
    ):
        core.set_config_variable(name, max(least, int(core.get_config_variable(name))))
    return core
