"""Small objects in the checkpoint bucket: run documents too large for user data, and the bootstrap."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

DELETE_BATCH = 1000
"""DeleteObjects' limit on keys a call (and ListObjectsV2's on keys a page)."""


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

    def delete_prefix(self, prefix: str, *, max_keys: int) -> bool:
        """Delete up to `max_keys` current objects under `prefix`, 1,000 a call (ListObjectsV2, then
        DeleteObjects); True once the listing shows none left. On a versioned bucket each becomes a
        delete marker and its data a noncurrent version, which the lifecycle rule removes later."""
        if not prefix.endswith("/") or prefix == "/":
            raise ValueError(f"refusing to delete under {prefix!r}: a job's prefix ends with '/'")
        deleted = 0
        while deleted < max_keys:
            page = self._s3.list_objects_v2(
                Bucket=self._bucket, Prefix=prefix, MaxKeys=min(DELETE_BATCH, max_keys - deleted)
            )
            keys = [obj["Key"] for obj in page.get("Contents", [])]
            if not keys:
                return True
            answer = self._s3.delete_objects(
                Bucket=self._bucket, Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True}
            )
            errors = answer.get("Errors", [])
            if errors:
                first = errors[0]
                raise RuntimeError(
                    f"{len(errors)} of {len(keys)} deletes under {prefix} failed: {first.get('Code')} {first.get('Key')}"
                )
            deleted += len(keys)
        return not self._s3.list_objects_v2(Bucket=self._bucket, Prefix=prefix, MaxKeys=1).get("Contents")
