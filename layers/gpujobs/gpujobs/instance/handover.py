"""A replacement attempt waits for the interrupted one to end before its workload starts.

The control plane launches the replacement at once, so it boots and pulls while the interrupted
attempt still saves its checkpoint. Starting the workload only once that attempt has ended (no
instance left, or its last checkpoint committed) lets the replacement resume from that checkpoint
rather than an older one. The wait is bounded and never fails the job (docs/instance.md).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from gpujobs.instance.contract import (
    ALIVE_STATES,
    CHECKPOINT_COMMIT_FILE,
    CHECKPOINT_STEP_DIR,
    LAST_COMMIT_REASONS,
    checkpoint_step_dir,
)
from gpujobs.instance.errors import StoppedError
from gpujobs.instance.log import log
from gpujobs.instance.rendezvous import describe_attempt


def attempt_instances(ec2: Any, *, job_id: str, attempt: int) -> list[str]:
    """Instances of `attempt` that may still run its workload (anything short of stopped/terminated)."""
    return sorted(i["InstanceId"] for i in describe_attempt(ec2, job_id=job_id, attempt=attempt, states=ALIVE_STATES))


def last_commit_by(s3: Any, *, uri: str, attempt: int, after_step: int | None) -> int | None:
    """The step of the checkpoint `attempt` committed as it ended, if newer than `after_step`; else None.

    Reads the trainer's layout on S3: `<uri>/step-NNNNNNNN/COMMIT.json`, which records `attempt` and
    `reason`. Only `preempted` or `final` counts: after a periodic commit the attempt may still be
    writing its preemption checkpoint. Other URI schemes are not read (None).
    """
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme != "s3":
        return None
    prefix = parsed.path.strip("/")
    base = prefix + "/" if prefix else ""
    steps: list[int] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=parsed.netloc, Prefix=base, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            match = CHECKPOINT_STEP_DIR.match(common["Prefix"][len(base) :])
            if match and int(match.group(1)) > (-1 if after_step is None else after_step):
                steps.append(int(match.group(1)))
    for step in sorted(steps, reverse=True):
        key = f"{base}{checkpoint_step_dir(step)}/{CHECKPOINT_COMMIT_FILE}"
        try:
            marker = json.loads(s3.get_object(Bucket=parsed.netloc, Key=key)["Body"].read())
        except (s3.exceptions.NoSuchKey, ValueError):
            continue  # a save cut short, or not a marker
        if (
            isinstance(marker, dict)
            and marker.get("attempt") == attempt
            and marker.get("reason") in LAST_COMMIT_REASONS
        ):
            return step
    return None


def wait_for_attempt(
    ec2: Any,
    *,
    job_id: str,
    attempt: int,
    timeout: float = 240.0,
    poll: float = 5.0,
    committed: Callable[[], int | None] | None = None,
) -> str:
    """Wait until the interrupted `attempt` has ended; returns why the wait is over.

    It has ended when none of its instances is left, or when `committed` finds the checkpoint it
    wrote as it ended. After `timeout` (the 2-minute spot notice plus margin) the wait is over anyway:
    the trainer resumes from the newest committed checkpoint either way, so waiting only avoids
    resuming from an older one. API errors are logged and waited out, never fatal.
    """
    deadline = time.monotonic() + timeout
    live: list[str] | None = None
    while True:
        try:
            live = attempt_instances(ec2, job_id=job_id, attempt=attempt)
        except StoppedError:
            raise
        except Exception as exc:  # a replacement must start even when EC2 cannot be asked
            log(f"cannot list the instances of attempt {attempt}: {exc}")
        if live == []:
            return f"attempt {attempt} has no instances left"
        if committed is not None:
            try:
                step = committed()
            except StoppedError:
                raise
            except Exception as exc:  # the instances are still a reliable signal
                log(f"cannot read checkpoints, waiting for the instances only: {exc}")
                committed = None
            else:
                if step is not None:
                    return f"attempt {attempt} committed its last checkpoint, step {step}"
        left = deadline - time.monotonic()
        if left <= 0:
            return f"attempt {attempt} still has instances {live} after {timeout:.0f}s; starting anyway"
        time.sleep(min(poll, left))
