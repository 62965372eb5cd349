"""`gpujobs interrupt JOB [--node K]`: a spot interruption drill, played by AWS FIS.

FIS's `aws:ec2:send-spot-instance-interruptions` action does to a spot instance what EC2 does when
it reclaims one: the instance-action notice on the instance's IMDS, the "EC2 Spot Instance
Interruption Warning" on EventBridge, and the reclaim once `durationBeforeInterruption` is over
(PT2M, EC2's own notice). So a drill exercises the path a real reclaim takes, end to end: the
trainer's checkpoint on the notice, the control plane's replacement on the warning, the reclaim.

The command reads the job's record, picks node K of its current attempt, refuses anything but a
spot instance (FIS would only fail the experiment later), creates one experiment template that
targets that instance by ARN and starts it. FIS acts as the stack's `SpotDrillRole`, which may
interrupt only the instances this stack tagged (docs/deploy.md "Drills"). The local cloud stores
the same experiment in moto and plays it on its instance (`gpujobs_local.fis_agent`), so
`gpujobs interrupt` is one code path on both.
"""

from __future__ import annotations

import argparse
import json
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from gpujobs.contract import JOB_TAG, STACK_TAG
from gpujobs.domain.job import Job, Market
from gpujobs_cli import commands
from gpujobs_cli.commands import EXIT_OK, CommandError, _discover, _get, _store
from gpujobs_cli.resources import SPOT_DRILL_ROLE, TABLE
from gpujobs_cli.shell import find_target

SPOT_INTERRUPTION_ACTION = "aws:ec2:send-spot-instance-interruptions"
NOTICE = "PT2M"
"""EC2's own notice before a reclaim (FIS accepts PT2M to PT15M)."""
NOTICE_SECONDS = 120
TARGET = "SpotInstances"


@dataclass(frozen=True)
class Drill:
    """A started drill: what `gpujobs interrupt --json` prints."""

    job_id: str
    node: int
    instance_id: str
    experiment_id: str
    experiment_template_id: str
    reclaim_after_seconds: int = NOTICE_SECONDS


def drill_target(job: Job, *, node: int, now: datetime) -> str:
    """The instance id of node `node` of the job's running attempt (as `gpujobs shell` finds it), if
    spot can interrupt it: a gang kept for inspection after a failure has nothing left to drill."""
    target = find_target(job, node=node, now=now)
    if job.state.is_terminal:
        raise CommandError(f"{job.job_id} is {job.state.value} (its gang is kept for inspection): nothing to interrupt")
    attempt = job.current_attempt
    market = attempt.market if attempt is not None else None
    if market is not Market.SPOT:
        runs = market.value if market is not None else "an unknown market"
        raise CommandError(f"only spot instances can be interrupted: {target.instance_id} of {job.job_id} runs {runs}")
    return target.instance_id


def instance_arn(instance_id: str, *, region: str, role_arn: str) -> str:
    """The instance's ARN; its account is the drill role's (the stack's own)."""
    parts = role_arn.split(":")
    if len(parts) < 6 or parts[2] != "iam" or not parts[4].isdigit():
        raise CommandError(f"the spot drill role {role_arn!r} is not an IAM role ARN")
    return f"arn:{parts[1]}:ec2:{region}:{parts[4]}:instance/{instance_id}"


def experiment_template(*, job_id: str, stack: str, arn: str, role_arn: str, token: str) -> dict[str, Any]:
    """CreateExperimentTemplate's request: one spot interruption of exactly `arn`, after PT2M."""
    return {
        "clientToken": token,
        "description": f"gpujobs drill: spot interruption of {arn.rsplit('/', 1)[-1]} ({job_id})",
        "roleArn": role_arn,
        "stopConditions": [{"source": "none"}],
        "targets": {TARGET: {"resourceType": "aws:ec2:spot-instance", "resourceArns": [arn], "selectionMode": "ALL"}},
        "actions": {
            "interrupt": {
                "actionId": SPOT_INTERRUPTION_ACTION,
                "description": "the spot notice, EC2's warning event, and the reclaim after it",
                "parameters": {"durationBeforeInterruption": NOTICE},
                "targets": {TARGET: TARGET},
            }
        },
        "tags": {STACK_TAG: stack, JOB_TAG: job_id},
    }


def interrupt(fis: Any, job: Job, *, node: int, now: datetime, stack: str, region: str, role_arn: str) -> Drill:
    """Create the drill's experiment template and start it; CommandError before any call if it cannot be."""
    instance_id = drill_target(job, node=node, now=now)
    arn = instance_arn(instance_id, region=region, role_arn=role_arn)
    token = str(uuid.uuid4())
    request = experiment_template(job_id=job.job_id, stack=stack, arn=arn, role_arn=role_arn, token=token)
    template = fis.create_experiment_template(**request)["experimentTemplate"]
    started = fis.start_experiment(
        clientToken=token, experimentTemplateId=template["id"], tags={STACK_TAG: stack, JOB_TAG: job.job_id}
    )["experiment"]
    return Drill(
        job_id=job.job_id,
        node=node,
        instance_id=instance_id,
        experiment_id=started["id"],
        experiment_template_id=template["id"],
    )


def cmd_interrupt(args: argparse.Namespace) -> int:
    resources = _discover(args, needs=(TABLE, SPOT_DRILL_ROLE))
    job = _get(_store(resources), args.job_id)
    drill = interrupt(
        resources.client("fis"),
        job,
        node=args.node,
        now=commands.utc_now(),
        stack=args.stack,
        region=resources.region_name,
        role_arn=resources.values[SPOT_DRILL_ROLE],
    )
    print(render(drill, as_json=args.json))
    return EXIT_OK


def render(drill: Drill, *, as_json: bool) -> str:
    if as_json:
        return json.dumps(asdict(drill), indent=2)
    return (
        f"interrupting node {drill.node} of {drill.job_id} ({drill.instance_id}): FIS experiment"
        f" {drill.experiment_id} started.\nEC2 warns it now and reclaims it in {drill.reclaim_after_seconds} s;"
        f" watch with: gpujobs status {drill.job_id} --watch"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help="job id, as printed by submit (j-...)")
    parser.add_argument(
        "--node", type=int, default=0, metavar="K", help="node K of the current attempt (default 0), as status lists"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


SUMMARY = "play a spot interruption of a job's instance (a drill, through AWS FIS)"
DESCRIPTION = (
    "Interrupt node K of the job's current attempt as spot would: AWS FIS's\n"
    f"{SPOT_INTERRUPTION_ACTION} action puts the two-minute notice on the instance's IMDS,\n"
    "sends EC2's 'EC2 Spot Instance Interruption Warning' event, and reclaims the instance after\n"
    "it. FIS acts as the stack's SpotDrillRole (output SpotDrillRoleArn, or GPUJOBS_SPOT_DRILL_ROLE_ARN),\n"
    "which may interrupt only this stack's instances. On the local cloud (gpujobs local up) the same\n"
    "command plays it on the local instance, with the local cloud's shorter notice.\n"
    "Only spot instances can be interrupted (exit 2 otherwise); an unknown job exits 3."
)
EPILOG = (
    "examples:\n  gpujobs interrupt j-0123456789abcdef\n  gpujobs interrupt j-0123456789abcdef --node 1\n"
    "  gpujobs interrupt j-0123456789abcdef --json | jq -r .experiment_id"
)
