"""GPU-idle alarms (CloudWatch Alarm State Change, alarm name prefix gpujobs-idle-<stack>-).

The rule filters on the prefix; the reaction still acts only on the exact name this stack gives
the alarm of the instance it names (another stack's alarm is ignored and counted).

Action `stop`: checkpoint now; once that checkpoint is committed the instances are terminated
(spot) or stopped (on-demand) and the job goes STOPPED with reason idle. Action `ignore`: recorded.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpujobs.adapters.inbound import detail_of, envelope
from gpujobs.adapters.inbound_alarms import AlarmStateChange
from gpujobs.domain.effects import Outcome
from gpujobs.runtime.bootstrap import reactions, require_settings
from gpujobs.runtime.observability import logger, metrics, report, tracer
from gpujobs.runtime.settings import Need
from gpujobs.service.reactions import Reaction

SETTINGS = require_settings(Need.SIGNAL)


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE, clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    alarm = detail_of(envelope(event), AlarmStateChange)
    instance_id = alarm.instance_id
    if alarm.state.value != "ALARM" or instance_id is None:
        report(Reaction(Outcome.ALARM_NOT_ACTIONABLE, detail=f"alarm {alarm.alarm_name} is {alarm.state.value}"))
        return
    reaction = reactions().stack_alarm(
        alarm_name=alarm.alarm_name, instance_id=instance_id, stack_name=SETTINGS.stack_name
    )
    report(reaction, alarm=alarm.alarm_name)
