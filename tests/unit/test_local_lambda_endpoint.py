"""The local cloud's Lambda Invoke endpoint answers a boto3 Lambda client as Lambda does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from gpujobs_local.lambda_endpoint import LambdaEndpoint

ARN = "arn:aws:lambda:us-east-1:123456789012:function:stack-CredentialsFunction"


def echo(name: str, payload: bytes) -> bytes | None:
    if name.split(":function:", 1)[-1] != "stack-CredentialsFunction":
        return None
    return json.dumps({"asked": json.loads(payload), "as": name}).encode()


@pytest.fixture
def client() -> Iterator[Any]:
    with LambdaEndpoint(echo) as endpoint:
        yield boto3.client(
            "lambda",
            endpoint_url=endpoint.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )


@pytest.mark.parametrize("name", ["stack-CredentialsFunction", ARN])
def test_a_served_function_answers_200_with_its_handlers_json(client: Any, name: str) -> None:
    answer = client.invoke(FunctionName=name, Payload=json.dumps({"job_id": "j"}).encode())

    assert answer["StatusCode"] == 200
    assert "FunctionError" not in answer
    assert json.loads(answer["Payload"].read()) == {"asked": {"job_id": "j"}, "as": name}


def test_an_unknown_function_is_resource_not_found(client: Any) -> None:
    with pytest.raises(ClientError) as refused:
        client.invoke(FunctionName="stack-Nope", Payload=b"{}")

    assert refused.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
