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

    keys = session_keys(credentials)
    return boto3.client(service, region_name=region, **keys)  # type: ignore[call-overload]  # the name is a plain str here
