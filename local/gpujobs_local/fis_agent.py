"""AWS FIS for the local instances: plays the spot-interruption experiments `gpujobs interrupt` starts.

On AWS, FIS's `aws:ec2:send-spot-instance-interruptions` action interrupts the target spot
instances: the instance-action notice on their IMDS, EC2's "EC2 Spot Instance Interruption Warning"
event, and the reclaim after `durationBeforeInterruption`. moto stores an experiment and runs none
of it; this agent polls moto's experiments (as `ssm_agent` polls its commands) and plays each new
one on the instances it targets through the instance runner (`InstanceRunner.interrupt_spot`), with
the local cloud's notice when it is shorter than the experiment's (a drill need not wait two minutes
here). An experiment targeting an on-demand instance, or one this host does not run, interrupts
nothing, as FIS would fail it.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from gpujobs_local.instances import InstanceRunner

log = logging.getLogger(__name__)
POLL_SECONDS = 1.0
SPOT_INTERRUPTION_ACTION = "aws:ec2:send-spot-instance-interruptions"
_DURATION = re.compile(r"^PT(?:(\d+)M)?(?:(\d+)S)?$")


def duration_seconds(value: str) -> float:
    """An ISO 8601 duration as FIS takes it for this action (PT2M .. PT15M); ValueError otherwise."""
    found = _DURATION.match(value)
    if found is None or not any(found.groups()):
        raise ValueError(f"durationBeforeInterruption {value!r} is not a duration like PT2M")
    minutes, seconds = (int(part or 0) for part in found.groups())
    return float(minutes * 60 + seconds)


class LocalFisAgent:
    def __init__(
        self, *, fis: Any, ec2: Any, runner: InstanceRunner, notice_seconds: float, poll_seconds: float = POLL_SECONDS
    ) -> None:
        self._fis = fis
        self._poll_seconds = poll_seconds
        self._ec2 = ec2
        self._runner = runner
        self._notice_seconds = notice_seconds
        self._done: set[str] = set()
        self._next_look = 0.0
        self.interrupted: list[tuple[str, str]] = []
        """(experiment id, instance id) of every interruption played."""

    def poll(self) -> None:
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + self._poll_seconds
        for summary in self._fis.list_experiments().get("experiments", []):
            if summary["id"] in self._done:
                continue
            self._done.add(summary["id"])
            experiment = self._fis.get_experiment(id=summary["id"])["experiment"]
            for action in experiment.get("actions", {}).values():
                self._play(experiment, action)

    def _play(self, experiment: dict[str, Any], action: dict[str, Any]) -> None:
        if action.get("actionId") != SPOT_INTERRUPTION_ACTION:
            log.info("FIS experiment %s: action %s is not played locally", experiment["id"], action.get("actionId"))
            return
        try:
            notice = duration_seconds(action.get("parameters", {}).get("durationBeforeInterruption", "PT2M"))
        except ValueError as exc:
            log.warning("FIS experiment %s: %s", experiment["id"], exc)
            return
        targets = experiment.get("targets", {})
        arns = [
            arn for name in action.get("targets", {}).values() for arn in targets.get(name, {}).get("resourceArns", [])
        ]
        for instance_id in (arn.rsplit("/", 1)[-1] for arn in arns):
            if instance_id not in self._runner.instances or not self._is_spot(instance_id):
                log.warning("FIS experiment %s: %s is not a running local spot instance", experiment["id"], instance_id)
                continue
            self._runner.interrupt_spot(instance_id, notice_seconds=min(notice, self._notice_seconds))
            self.interrupted.append((experiment["id"], instance_id))

    def _is_spot(self, instance_id: str) -> bool:
        reservations = self._ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        found = [i for r in reservations for i in r["Instances"]]
        return bool(found) and found[0].get("InstanceLifecycle") == "spot"
