"""Whether a job's idle detection works: its idle alarms must be fed the GPU metric.

Idle detection rests on the CloudWatch agent on each instance, which publishes
`CWAgent / nvidia_smi_utilization_gpu` per `InstanceId`. The bootstrap starts the agent, installing
it where the AMI lacks it, and says so when it cannot (`IDLE DETECTION IS OFF` in its log, and
`gpu_metrics` in its exit report, which comes only at the end). The control plane tells the user
while the job runs: once an attempt has run `GPU_METRIC_GRACE` (boot, the agent's start, its first
datapoints), an instance whose idle alarm was evaluated and saw no datapoint is fed nothing, and
the job is noted, once per attempt, in its status and with a `GPU Idle Detection Off` event.

Seeing no datapoint, not the alarm's state, is the sign: the alarms treat missing data as not
breaching (`adapters.cloudwatch`), so a silent agent leaves the alarm `OK`, never `ALARM`, and a
job is never stopped as idle for want of a metric. An alarm not evaluated yet (just created or
recreated) says nothing either way.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from gpujobs.domain.effects import Decision, Outcome, ignore, live_instances
from gpujobs.domain.job import Job, cap_detail
from gpujobs.domain.launching import wants_idle_alarms
from gpujobs.domain.states import JobState

GPU_METRIC_GRACE = timedelta(minutes=15)
"""From the attempt's start to the first GPU datapoints: boot, the image pull, the agent's start."""


def note_idle_detection_off(job: Job, *, silent: Collection[str], now: datetime) -> Decision:
    """Note on the RUNNING job that idle detection is off when an instance of its current attempt is
    in `silent` (its alarm's last evaluation saw no GPU datapoint) past the grace; once per attempt."""
    attempt = job.current_attempt
    if job.state is not JobState.RUNNING or attempt is None or attempt.is_over or not wants_idle_alarms(job):
        return ignore(Outcome.NOT_RUNNING)
    if attempt.idle_detection_off_at is not None:
        return ignore(Outcome.ALREADY_HANDLED, "idle detection already noted off for this attempt")
    quiet = [iid for iid in live_instances(attempt) if iid in silent]
    if not quiet or now - attempt.started_at < GPU_METRIC_GRACE:
        return ignore(Outcome.NOTHING_TO_DECIDE)
    note = idle_detection_off_note(quiet, since=attempt.started_at)
    noted = job.with_attempt(attempt.model_copy(update={"idle_detection_off_at": now}), now=now)
    return Decision(
        Outcome.IDLE_DETECTION_OFF, noted.model_copy(update={"status_detail": cap_detail(note)}), detail=note
    )


def idle_detection_off_note(instance_ids: Collection[str], *, since: datetime) -> str:
    return (
        f"idle detection is off for this job: no GPU metric from {', '.join(instance_ids)} since "
        f"{since:%Y-%m-%d %H:%M} UTC (the CloudWatch agent is not publishing; see the instance's "
        "'IDLE DETECTION IS OFF' log line); an idle GPU will not be stopped"
    )
