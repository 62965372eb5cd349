"""Small objects in the checkpoint bucket: run documents too large for user data, and the bootstrap."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client


class S3BlobStore:
    def __init__(self, *, client: S3Client, bucket: str) -> None:
        self._s3 = client
        self._bucket = bucket

    def put_text(self, key: str, text: str) -> str:
        self._s3.put_object(Bucket=self._bucket, Key=key, Body=text.encode(), ContentType="application/json")
        return f"s3://{self._bucket}/{key}"

    def put_once(self, key: str, body: bytes) -> None:
        """Store `body` under a content-addressed `key` unless an object is there already.

        A conditional write (If-None-Match), so it needs only s3:PutObject and never adds a version;
        whoever reads the object checks its digest, so what is there is never trusted blindly.
        """
        try:
            self._s3.put_object(Bucket=self._bucket, Key=key, Body=body, IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise
