"""`gpujobs local tour`: the control plane alone on an in-process AWS (moto), nothing mocked by hand.

The stack is built from template.yaml itself (table, queue and DLQ, bucket, bus, launch template);
the real `gpujobs` CLI sends the specs; the real submit Lambda handler consumes the queue; what
comes out is read back the way an operator would: jobs in the table, instances in EC2, the run
document in each instance's user data, the events on the bus.

The story: a job lands on spot in the first pool; a two-node gang finds no g5 spot capacity and
falls back along the ladder; a duplicate delivery launches nothing; a bad spec is rejected with
reasons; a spot warning gets the container checkpointing while a replacement boots in another
zone; a cancel terminates the instances.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any

from gpujobs.contract import ATTEMPT_TAG, EC2_SOURCE, JOB_TAG, SPOT_INTERRUPTION_WARNING, TEAM_TAG
from gpujobs_local.stack import ROOT, LambdaContext, MotoStack, load_function
from gpujobs_local.story import Story, story_parser


def cli(*argv: str) -> tuple[int, str]:
    """Run the real gpujobs CLI in-process and capture what it prints."""
    from gpujobs_cli.main import main as gpujobs_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = gpujobs_main(list(argv))
    return code, out.getvalue() + err.getvalue()


def quietly(handler: Any) -> Any:
    """The handler as Lambda runs it, minus its JSON log and metric lines on the tour's stdout."""

    def invoke(event: dict[str, Any], context: Any) -> Any:
        with contextlib.redirect_stdout(io.StringIO()):
            return handler(event, context)

    return invoke


TOUR_ENV = {
    "AWS_ACCESS_KEY_ID": "demo",
    "AWS_SECRET_ACCESS_KEY": "demo",
    "AWS_DEFAULT_REGION": "us-east-1",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_LOG_LEVEL": "ERROR",
    "POWERTOOLS_SERVICE_NAME": "gpujobs",
    "POWERTOOLS_METRICS_NAMESPACE": "GpuJobs",
}


def no_g5_spot(params: dict[str, Any], **_: Any) -> None:
    """A botocore hook refusing g5 spot launches the way EC2 does when the pool is empty."""
    from botocore.exceptions import ClientError

    if params["InstanceType"] == "g5.xlarge" and "InstanceMarketOptions" in params:
        raise ClientError({"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no g5 spot"}}, "RunInstances")


class Tour:
    """The deployed stack on moto, the submit handler and the story told about them."""

    def __init__(self, story: Story) -> None:
        from gpujobs.adapters.dynamodb import DynamoJobStore

        self.story = story
        self.stack = MotoStack()
        os.environ.update(self.stack.env)
        os.environ.update({"GPUJOBS_QUEUE_URL": self.stack.queue_url, "GPUJOBS_TABLE": self.stack.table})
        self.store = DynamoJobStore(table_name=self.stack.table, client=self.stack.ddb)
        self.submit = self.fresh_handler()
        self.summary: dict[str, Any] = {"jobs": {}}

    def fresh_handler(self) -> Any:
        """A cold start: a new container with new clients (so newly registered hooks apply)."""
        from gpujobs.runtime import bootstrap

        bootstrap.reset()
        return quietly(load_function("submit").handler)

    def show_job(self, job_id: str) -> None:
        for entry in self.store.get(job_id).history:
            src = entry.source.value if entry.source else "(new)"
            detail = f" - {entry.detail}" if entry.detail else ""
            self.story.say(f"    {src:>11} -> {entry.target.value:<9} {entry.reason.value}{detail[:110]}")

    def show_instances(self, job_id: str) -> list[dict[str, Any]]:
        found = self.stack.instances(**{JOB_TAG: job_id})
        for inst in sorted(found, key=lambda i: i["AmiLaunchIndex"]):
            tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
            self.story.say(
                f"    {inst['InstanceId']}  {inst['InstanceType']:<10} {inst['Placement']['AvailabilityZone']}"
                f"  {inst.get('InstanceLifecycle', 'on-demand'):<9} rank {inst['AmiLaunchIndex']}"
                f"  attempt {tags[ATTEMPT_TAG]}  team {tags[TEAM_TAG]}"
            )
        return found

    def submit_file(self, name: str) -> str:
        code, out = cli("submit", str(ROOT / "examples" / name))
        job_id = out.strip().splitlines()[0]
        self.story.say(f"  $ gpujobs submit examples/{name}  ->  {job_id} (exit {code})")
        self.stack.deliver(self.submit)
        return job_id

    def first_job(self) -> str:
        from gpujobs.instance.userdata import parse_user_data

        self.story.step("1. An ML engineer submits examples/digits.yaml with the gpujobs CLI")
        job_id = self.submit_file("digits.yaml")
        self.story.say("  the submit function consumed the queue:")
        self.show_job(job_id)
        instances = self.show_instances(job_id)
        document = parse_user_data(self.stack.user_data(instances[0]["InstanceId"])).model_dump()
        self.story.say(f"  user data carries the run document: command {document['command']}")
        self.story.say(f"  checkpoints go to {document['checkpoint_uri']}")
        state = self.store.get(job_id).state.value
        self.summary["jobs"]["digits"] = {"job_id": job_id, "state": state, "instances": len(instances)}
        return job_id

    def gang_on_short_capacity(self) -> str:
        self.story.step("2. A two-node gang while g5 spot capacity is short (InsufficientInstanceCapacity)")
        self.stack.on_aws("provide-client-params.ec2.RunInstances", no_g5_spot)
        self.submit = self.fresh_handler()
        job_id = self.submit_file("digits-2node.yaml")
        job = self.store.get(job_id)
        attempt = job.current_attempt
        if attempt is None:
            raise RuntimeError(f"{job_id} was not launched: {job.status_detail}")
        for t in attempt.tries:
            self.story.say(f"    refused: {t.instance_type} {t.zone} {t.market.value}: {t.error_code}")
        self.show_job(job_id)
        instances = self.show_instances(job_id)
        self.stack.off_aws("provide-client-params.ec2.RunInstances", no_g5_spot)  # capacity is back
        self.submit = self.fresh_handler()
        self.summary["jobs"]["gang"] = {
            "job_id": job_id,
            "state": job.state.value,
            "instance_type": attempt.instance_type,
            "refused_tries": len(attempt.tries),
            "instances": len(instances),
        }
        return job_id

    def duplicate_delivery(self) -> None:
        from gpujobs.domain.job_ids import job_id_for

        self.story.step("3. SQS delivers the same message twice")
        spec = {"name": "twice", "image": "r/i:1", "command": ["python", "t.py"], "instance_types": ["g6.xlarge"]}
        self.stack.send(spec)
        sqs, url = self.stack.sqs, self.stack.queue_url
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)["Messages"]
        for _ in range(2):
            self.submit(self.stack.sqs_event(messages), LambdaContext())
        sqs.delete_message(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"])
        job_id = job_id_for(client_token=None, team=None, message_id=messages[0]["MessageId"])
        count = len(self.stack.instances(**{JOB_TAG: job_id}))
        self.story.say(f"  two deliveries -> one job {job_id}, {count} instance (RunInstances ran once)")
        self.summary["jobs"]["duplicate"] = {"job_id": job_id, "instances": count}

    def bad_spec(self) -> None:
        from gpujobs.domain.job_ids import job_id_for

        self.story.step("4. A bad spec sent straight to the queue (aws sqs send-message)")
        bad = {"name": "Digits", "image": "r/i:1", "command": [], "instance_types": ["x1.32xlarge"], "nodes": 0}
        message_id = self.stack.send(bad)
        self.stack.deliver(self.submit)
        rejected = self.store.get(job_id_for(client_token=None, team=None, message_id=message_id))
        self.story.say(f"  {rejected.job_id} {rejected.state.value}, consumed (no retry loop):")
        for problem in rejected.problems:
            self.story.say(f"    - {problem}")
        self.summary["jobs"]["rejected"] = {"job_id": rejected.job_id, "problems": list(rejected.problems)}

    def spot_warning(self, job_id: str) -> None:
        self.story.step(f"5. EC2 warns that the spot instance of {job_id} will be reclaimed in two minutes")
        job = self.store.get(job_id)
        (instance_id,) = job.instance_ids
        event = self.stack.eventbridge(
            EC2_SOURCE,
            SPOT_INTERRUPTION_WARNING,
            {"instance-id": instance_id, "instance-action": "terminate"},
            resources=[f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"],
        )
        quietly(load_function("spot").handler)(event, LambdaContext())
        (command,) = self.stack.ssm.list_commands()["Commands"]
        self.story.say(
            f"  checkpoint now: SSM {command['DocumentName']} -> {command['Parameters']['containerName'][0]}"
            f" on {instance_id}"
        )
        self.show_job(job_id)
        after = self.store.get(job_id)
        replacement = after.current_attempt
        assert replacement is not None
        self.story.say(
            f"  replacement attempt {replacement.number}: {replacement.instance_type} {replacement.zone}"
            f" {replacement.market.value if replacement.market else '?'}, booting while the old one checkpoints"
        )
        self.summary["jobs"]["digits"]["after_warning"] = {
            "state": after.state.value,
            "interruptions": after.interruptions,
            "replacement_zone": replacement.zone,
            "replacement_attempt": replacement.number,
        }

    def cancel(self, job_id: str) -> None:
        self.story.step(f"6. gpujobs cancel {job_id}")
        _, out = cli("cancel", job_id)
        self.story.say(f"  $ gpujobs cancel {job_id}  ->  {out.strip().splitlines()[0]}")
        self.stack.deliver(self.submit)
        left = len(self.stack.instances(**{JOB_TAG: job_id}))
        state = self.store.get(job_id).state.value
        self.story.say(f"  {job_id} {state}; instances left: {left}")
        self.summary["jobs"]["gang"]["after_cancel"] = {"state": state, "instances": left}

    def subscriber_view(self) -> None:
        self.story.step("7. What a subscriber to the bus saw (GPU Job State Change)")
        seen = self.stack.observed_events()
        self.story.say(f"  {len(seen)} events, e.g. {json.dumps(seen[1]['detail'])[:150]}...")
        self.summary["state_change_events"] = len(seen)
        _, out = cli("list", "--state", "all")
        self.story.say("  $ gpujobs list --state all")
        for line in out.rstrip().splitlines():
            self.story.say(f"  {line}")


def run(story: Story) -> dict[str, Any]:
    os.environ.update(TOUR_ENV)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    from moto import mock_aws

    with mock_aws():
        story.step("Deploying the stack from template.yaml onto an in-process AWS (moto)")
        tour = Tour(story)
        stack = tour.stack
        story.say(f"  table {stack.table}, queue + DLQ, bucket {stack.bucket}, bus {stack.bus},")
        story.say(f"  launch template {stack.launch_template}, subnets {', '.join(stack.subnets)} (us-east-1a, b)")
        digits = tour.first_job()
        gang = tour.gang_on_short_capacity()
        tour.duplicate_delivery()
        tour.bad_spec()
        tour.spot_warning(digits)
        tour.cancel(gang)
        tour.subscriber_view()
    tour.summary["total_seconds"] = round(story.elapsed(), 2)
    return tour.summary


def main(argv: list[str] | None = None) -> int:
    args = story_parser(prog="gpujobs local tour", description=__doc__).parse_args(argv)
    story = Story(out=None if args.json else sys.stdout, spaced=True)
    summary = run(story)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        story.step(f"Done in {summary['total_seconds']} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
