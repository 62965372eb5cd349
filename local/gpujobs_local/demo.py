"""`make demo`: the control plane doing its job on an in-process AWS (moto), nothing mocked by hand.

The stack is built from template.yaml itself (table, queue and DLQ, bucket, bus, launch template);
the real `gpujobs` CLI sends the specs; the real submit Lambda handler consumes the queue; what
comes out is read back the way an operator would: jobs in the table, instances in EC2, the run
document in each instance's user data, the events on the bus.

The story: a job lands on spot in the first pool; a two-node gang finds no g5 spot capacity and
falls back along the ladder; a duplicate delivery launches nothing; a bad spec is rejected with
reasons; a cancel terminates the instances.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class Story:
    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.perf_counter()

    def say(self, text: str = "") -> None:
        if not self.quiet:
            print(text, flush=True)

    def step(self, title: str) -> None:
        self.say(f"\n[{time.perf_counter() - self.started:5.1f}s] {title}")


def cli(*argv: str) -> tuple[int, str]:
    """Run the real gpujobs CLI in-process and capture what it prints."""
    from gpujobs.cli.main import main as gpujobs_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = gpujobs_main(list(argv))
    return code, out.getvalue() + err.getvalue()


def quietly(handler: Any) -> Any:
    """The handler as Lambda runs it, minus its JSON log and metric lines on the demo's stdout."""

    def invoke(event: dict[str, Any], context: Any) -> Any:
        with contextlib.redirect_stdout(io.StringIO()):
            return handler(event, context)

    return invoke


def run(story: Story) -> dict[str, Any]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "demo",
        "AWS_SECRET_ACCESS_KEY": "demo",
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "POWERTOOLS_LOG_LEVEL": "ERROR",
        "POWERTOOLS_SERVICE_NAME": "gpujobs",
        "POWERTOOLS_METRICS_NAMESPACE": "GpuJobs",
    }.items():
        os.environ[key] = value
    os.environ.pop("AWS_ENDPOINT_URL", None)

    from botocore.exceptions import ClientError
    from moto import mock_aws

    from gpujobs.adapters.dynamodb import DynamoJobStore
    from gpujobs.instance.userdata import parse_user_data
    from gpujobs.runtime import bootstrap
    from gpujobs_local.stack import MotoStack, load_function

    summary: dict[str, Any] = {"jobs": {}}
    with mock_aws():
        story.step("Deploying the stack from template.yaml onto an in-process AWS (moto)")
        stack = MotoStack()
        os.environ.update(stack.env)
        os.environ.update({"GPUJOBS_QUEUE_URL": stack.queue_url, "GPUJOBS_TABLE": stack.table})
        bootstrap.job_service.cache_clear()
        submit = quietly(load_function("submit").handler)
        store = DynamoJobStore(table_name=stack.table, client=stack.ddb)
        story.say(f"  table {stack.table}, queue + DLQ, bucket {stack.bucket}, bus {stack.bus},")
        story.say(f"  launch template {stack.launch_template}, subnets {', '.join(stack.subnets)} (us-east-1a, b)")

        def show_job(job_id: str) -> dict[str, Any]:
            job = store.get(job_id)
            for entry in job.history:
                src = entry.source.value if entry.source else "(new)"
                detail = f" - {entry.detail}" if entry.detail else ""
                story.say(f"    {src:>11} -> {entry.target.value:<9} {entry.reason.value}{detail[:110]}")
            return job.model_dump(mode="json")

        def show_instances(job_id: str) -> list[dict[str, Any]]:
            found = stack.instances(**{"gpujobs:job-id": job_id})
            for inst in sorted(found, key=lambda i: i["AmiLaunchIndex"]):
                tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
                story.say(
                    f"    {inst['InstanceId']}  {inst['InstanceType']:<10} {inst['Placement']['AvailabilityZone']}"
                    f"  {inst.get('InstanceLifecycle', 'on-demand'):<9} rank {inst['AmiLaunchIndex']}"
                    f"  attempt {tags['gpujobs:attempt']}  team {tags['gpujobs:team']}"
                )
            return found

        story.step("1. An ML engineer submits examples/digits.yaml with the gpujobs CLI")
        code, out = cli("submit", str(ROOT / "examples" / "digits.yaml"))
        digits = out.strip().splitlines()[0]
        story.say(f"  $ gpujobs submit examples/digits.yaml  ->  {digits} (exit {code})")
        stack.deliver(submit)
        story.say("  the submit function consumed the queue:")
        first = show_job(digits)
        instances = show_instances(digits)
        document = parse_user_data(stack.user_data(instances[0]["InstanceId"])).model_dump()
        story.say(f"  user data carries the run document: command {document['command']}")
        story.say(f"  checkpoints go to {document['checkpoint_uri']}")
        summary["jobs"]["digits"] = {"job_id": digits, "state": first["state"], "instances": len(instances)}

        story.step("2. A two-node gang while g5 spot capacity is short (InsufficientInstanceCapacity)")

        def no_g5_spot(params: dict[str, Any], **_: Any) -> None:
            if params["InstanceType"] == "g5.xlarge" and "InstanceMarketOptions" in params:
                raise ClientError(
                    {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no g5 spot"}}, "RunInstances"
                )

        stack.on_aws("provide-client-params.ec2.RunInstances", no_g5_spot)
        bootstrap.job_service.cache_clear()
        submit = quietly(load_function("submit").handler)
        code, out = cli("submit", str(ROOT / "examples" / "digits-2node.yaml"))
        gang = out.strip().splitlines()[0]
        stack.deliver(submit)
        gang_job = store.get(gang)
        attempt = gang_job.current_attempt
        assert attempt is not None
        for t in attempt.tries:
            story.say(f"    refused: {t.instance_type} {t.zone} {t.market.value}: {t.error_code}")
        show_job(gang)
        gang_instances = show_instances(gang)
        summary["jobs"]["gang"] = {
            "job_id": gang,
            "state": gang_job.state.value,
            "instance_type": attempt.instance_type,
            "refused_tries": len(attempt.tries),
            "instances": len(gang_instances),
        }

        story.step("3. SQS delivers the same message twice")
        stack.send({"name": "twice", "image": "r/i:1", "command": ["python", "t.py"], "instance_types": ["g6.xlarge"]})
        messages = stack.sqs.receive_message(QueueUrl=stack.queue_url, MaxNumberOfMessages=1)["Messages"]
        from gpujobs_local.stack import LambdaContext

        submit(stack.sqs_event(messages), LambdaContext())
        submit(stack.sqs_event(messages), LambdaContext())
        stack.sqs.delete_message(QueueUrl=stack.queue_url, ReceiptHandle=messages[0]["ReceiptHandle"])
        from gpujobs.domain.job import job_id_for

        twice = job_id_for(client_token=None, team=None, message_id=messages[0]["MessageId"])
        count = len(stack.instances(**{"gpujobs:job-id": twice}))
        story.say(f"  two deliveries -> one job {twice}, {count} instance (RunInstances ran once)")
        summary["jobs"]["duplicate"] = {"job_id": twice, "instances": count}

        story.step("4. A bad spec sent straight to the queue (aws sqs send-message)")
        bad = {"name": "Digits", "image": "r/i:1", "command": [], "instance_types": ["x1.32xlarge"], "nodes": 0}
        bad_message = stack.send(bad)
        stack.deliver(submit)
        rejected = store.get(job_id_for(client_token=None, team=None, message_id=bad_message))
        story.say(f"  {rejected.job_id} {rejected.state.value}, consumed (no retry loop):")
        for problem in rejected.problems:
            story.say(f"    - {problem}")
        summary["jobs"]["rejected"] = {"job_id": rejected.job_id, "problems": list(rejected.problems)}

        story.step(f"5. gpujobs cancel {gang}")
        code, out = cli("cancel", gang)
        story.say(f"  $ gpujobs cancel {gang}  ->  {out.strip().splitlines()[0]}")
        stack.deliver(submit)
        left = len(stack.instances(**{"gpujobs:job-id": gang}))
        story.say(f"  {gang} {store.get(gang).state.value}; instances left: {left}")
        summary["jobs"]["gang"]["after_cancel"] = {"state": store.get(gang).state.value, "instances": left}

        story.step("6. What a subscriber to the bus saw (GPU Job State Change)")
        seen = stack.observed_events()
        story.say(f"  {len(seen)} events, e.g. {json.dumps(seen[1]['detail'])[:150]}...")
        summary["state_change_events"] = len(seen)
        code, out = cli("list", "--state", "all")
        story.say("  $ gpujobs list --state all")
        for line in out.rstrip().splitlines():
            story.say(f"  {line}")
    summary["total_seconds"] = round(time.perf_counter() - story.started, 2)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpujobs-local",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print one JSON summary object instead of the story")
    args = parser.parse_args(argv)
    story = Story(quiet=args.json)
    summary = run(story)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        story.step(f"Done in {summary['total_seconds']} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
