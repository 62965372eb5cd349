"""The local cloud's fake IMDSv2, set up as one instance of a bootstrap test."""

from __future__ import annotations

from gpujobs_local.imds import FakeImds as LocalImds


def FakeImds(
    *,
    user_data: bytes,
    instance_id: str = "i-0123456789abcdef0",
    launch_index: int = 0,
    local_ipv4: str = "10.0.0.5",
    region: str = "us-east-1",
    instance_type: str = "g5.xlarge",
) -> LocalImds:
    return LocalImds(
        user_data=user_data,
        metadata={
            "instance-id": instance_id,
            "ami-launch-index": str(launch_index),
            "local-ipv4": local_ipv4,
            "placement/region": region,
            "instance-type": instance_type,
        },
    )
