"""Reports from the training container and the instance bootstrap (the stack's own bus).

`Checkpoint Committed` moves the job's newest checkpoint forward only; `Training Heartbeat`
records progress; `Job Exited` records a node's exit code and lets the attempt be judged.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpujobs.adapters.inbound import CheckpointCommitted, Heartbeat, JobExited, detail_of, envelope
from gpujobs.contract import CHECKPOINT_COMMITTED, JOB_EXITED, TRAINING_HEARTBEAT
from gpujobs.domain.effects import Outcome
from gpujobs.runtime.bootstrap import reactions, require_settings
from gpujobs.runtime.observability import logger, metrics, report, tracer
from gpujobs.runtime.settings import Need
from gpujobs.service.reactions import Reaction

SETTINGS = require_settings(Need.LAUNCH)


def react(detail_type: str, event: Any) -> Reaction:
    if detail_type == CHECKPOINT_COMMITTED:
        c = detail_of(event, CheckpointCommitted)
        return reactions().checkpoint_committed(job_id=c.job_id, attempt=c.attempt, step=c.step, uri=c.uri)
    if detail_type == TRAINING_HEARTBEAT:
        h = detail_of(event, Heartbeat)
        return reactions().heartbeat(job_id=h.job_id, attempt=h.attempt, step=h.step)
    if detail_type == JOB_EXITED:
        x = detail_of(event, JobExited)
        return reactions().job_exited(
            job_id=x.job_id, attempt=x.attempt, exit_code=x.exit_code, instance_id=x.instance_id, node_rank=x.node_rank
        )
    return Reaction(Outcome.UNKNOWN_REPORT, detail=repr(detail_type))


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE, clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    received = envelope(event)
    report(react(received.detail_type, received), event=received.detail_type, source=received.source)
