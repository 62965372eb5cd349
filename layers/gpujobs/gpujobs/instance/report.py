"""The exit report: one "Job Exited" event on the job's bus when the bootstrap ends, whatever ended it.

The control plane records the node's exit code from it and judges the attempt. Publishing is
retried, and a failure to publish is logged, never raised: the instance still shuts down, and the
reconciler sees it terminate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from gpujobs.instance.contract import EVENT_DETAIL_TYPE, EVENT_SOURCE
from gpujobs.instance.log import log


def exit_detail(
    doc: dict[str, Any],
    *,
    node_rank: int | None,
    instance_id: str | None,
    exit_code: int,
    reason: str,
    message: str,
    gpu_metrics: str | None = None,
) -> dict[str, Any]:
    """The event's detail; `doc` may be partial (or empty) when the run document was unreadable.
    `gpu_metrics`: for a GPU job on docker, whether the CloudWatch agent fed its idle alarm
    (`cloudwatch_agent.GpuMetrics`); shown to users, never acted on, so outside the signature."""
    detail = {
        "job_id": doc.get("job_id"),
        "attempt": doc.get("attempt"),
        "node_rank": node_rank,
        "instance_id": instance_id,
        "exit_code": exit_code,
        "reason": reason,
        "message": message,
    }
    if gpu_metrics is not None:
        detail["gpu_metrics"] = gpu_metrics
    return detail


def publish_exit(
    events: Callable[[], Any], *, bus: str, detail: dict[str, Any], tries: int = 4, backoff: float = 1.0
) -> bool:
    """Put "Job Exited" on the bus; retried, and a failure is logged, never raised."""
    entry = {"Source": EVENT_SOURCE, "DetailType": EVENT_DETAIL_TYPE, "Detail": json.dumps(detail), "EventBusName": bus}
    for attempt in range(tries):
        try:
            response = events().put_events(Entries=[entry])
            if not response.get("FailedEntryCount"):
                return True
            log(f"put_events rejected the event: {response.get('Entries')}")
        except Exception as exc:  # reporting must never crash the bootstrap
            log(f"put_events failed: {exc}")
        if attempt < tries - 1:
            time.sleep(backoff * 2**attempt)
    return False
