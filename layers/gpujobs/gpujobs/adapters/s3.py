"""Small text objects in the checkpoint bucket (run documents too large for user data)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client


class S3BlobStore:
    def __init__(self, *, client: S3Client, bucket: str) -> None:
        self._s3 = client
        self._bucket = bucket

    def put_text(self, key: str, text: str) -> str:
        self._s3.put_object(Bucket=self._bucket, Key=key, Body=text.encode(), ContentType="application/json")
        return f"s3://{self._bucket}/{key}"
