"""The gpujobs stack on moto, built from template.yaml's own definitions, plus an SQS event source.

`MotoStack` creates what `sam deploy` would (table, queue + DLQ, bucket, bus, job log group, launch
template, a VPC with two subnets) and sets the environment the template gives the functions. `deliver()` plays the
part of Lambda's SQS event source mapping: it receives messages, invokes the real handler with the
Lambda event shape, deletes what succeeded and leaves reported failures to come back after their
visibility timeout, until the queue's redrive policy moves them to the dead-letter queue.

Each delivery carries the message's `SenderId`, as Lambda's does. moto reports one sender for every
message (`MOTO_SENDER`, its default user), whatever credentials sent it; `deliver(sender=...)` plays a
message sent by another principal. `teams` (a team configuration, JSON) is stored in SSM and named
to the functions as the stack's `TeamsParameterName` would; without it the stack has none.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import importlib.util
import io
import json
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
from botocore.awsrequest import AWSResponse, HTTPHeaders
from botocore.config import Config
from botocore.exceptions import ClientError

from gpujobs.contract import UP_STATES, job_log_group
from gpujobs.domain.report_auth import sign
from gpujobs.instance.rundoc import extract_run_json
from gpujobs_local import template
from gpujobs_local.placement_groups import PlacementGroups
from gpujobs_local.price_list import PriceList
from gpujobs_local.spot_scores import SpotScores
from gpujobs_local.streams import TableStream, filter_patterns

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
STACK = "gpujobs-local"
MOTO_FIRST_AMAZON_AMI = "ami-03cf127a"
ALLOWED = ("g5.xlarge", "g6.xlarge", "p4d.24xlarge", "c7i.large")
MOTO_SENDER = "AIDAIT2UOQQY3AUEKVGXU"
"""The SenderId moto gives every SQS message (its default user's unique id)."""
_NO_ACCOUNT_ENDPOINT = Config(account_id_endpoint_mode="disabled")
"""moto serves DynamoDB Streams only on its `streams.dynamodb.*` host (aws-contracts §0.8)."""


@dataclass
class LambdaContext:
    function_name: str = f"{STACK}-SubmitFunction"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:123456789012:function:{STACK}-SubmitFunction"
    aws_request_id: str = "req-1"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


@dataclass
class MotoStack:
    """The stack's resources, under `mock_aws()` or against a moto server (AWS_ENDPOINT_URL set)."""

    env: dict[str, str] = field(default_factory=dict)
    stack_name: str = STACK
    allowed_instance_types: tuple[str, ...] = ALLOWED
    teams: str | None = None
    """A team configuration (JSON, see domain.teams); None: the stack has none."""
    _stream: TableStream | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        stack = self.stack_name
        boto3.setup_default_session()
        self._answer_what_moto_cannot()
        # Any: what it describes is read back as plain dicts (the tour, the tests).
        self.ec2: Any = boto3.client("ec2", region_name=REGION)
        self.sqs = boto3.client("sqs", region_name=REGION)
        self.ddb = boto3.client("dynamodb", region_name=REGION)
        self.events = boto3.client("events", region_name=REGION)
        self.s3 = boto3.client("s3", region_name=REGION)

        vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnets = [
            self.ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"{REGION}{z}")["Subnet"][
                "SubnetId"
            ]
            for i, z in enumerate("ab")
        ]
        self.security_group = self.ec2.create_security_group(GroupName="gpujobs", Description="gpujobs", VpcId=vpc)[
            "GroupId"
        ]
        image = _an_amazon_image(self.ec2)
        self.launch_template = self.ec2.create_launch_template(
            LaunchTemplateName=f"{stack}-instances",
            LaunchTemplateData=template.launch_template_data(
                image_id=image,
                instance_profile_arn="arn:aws:iam::123456789012:instance-profile/gpujobs-test",
                stack_name=stack,
            ),
        )["LaunchTemplate"]["LaunchTemplateId"]

        self.table = f"{stack}-jobs"
        self.ddb.create_table(**template.table_definition(table_name=self.table))

        dlq = self.sqs.create_queue(QueueName=f"{stack}-dlq")["QueueUrl"]
        self.dlq_url = dlq
        dlq_arn = self.sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.queue_url = self.sqs.create_queue(
            QueueName=f"{stack}-jobs", Attributes=template.queue_attributes(dead_letter_arn=dlq_arn)
        )["QueueUrl"]

        self.bucket = f"{stack}-checkpoints"
        self.s3.create_bucket(Bucket=self.bucket)
        self.bus = f"{stack}-jobs"
        self.events.create_event_bus(Name=self.bus)
        # Capture what the control plane publishes, as a subscriber would.
        self.events_queue = self.sqs.create_queue(QueueName=f"{stack}-observed")["QueueUrl"]
        observed_arn = self.sqs.get_queue_attributes(QueueUrl=self.events_queue, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        self.events.put_rule(
            Name="all-state-changes", EventBusName=self.bus, EventPattern=json.dumps({"source": ["gpujobs"]})
        )
        self.events.put_targets(
            Rule="all-state-changes", EventBusName=self.bus, Targets=[{"Id": "q", "Arn": observed_arn}]
        )

        self.instance_role_arn = self._create_instance_role()
        self.job_role_arn = self._create_job_role()

        # The template's JobLogGroup: every node's output and bootstrap log (gpujobs logs reads it).
        self.log_group = job_log_group(stack)
        logs = boto3.client("logs", region_name=REGION)
        logs.create_log_group(logGroupName=self.log_group)
        retention = template.parameter_default(template.properties("JobLogGroup")["RetentionInDays"]["Ref"])
        logs.put_retention_policy(logGroupName=self.log_group, retentionInDays=int(retention))

        self.ssm = boto3.client("ssm", region_name=REGION)
        self.checkpoint_document = f"{stack}-checkpoint-now"
        self.ssm.create_document(
            Name=self.checkpoint_document,
            Content=json.dumps(template.properties("CheckpointNowDocument")["Content"]),
            DocumentType="Command",
        )

        # The stack's report secret, generated as Secrets Manager does for the template's resource.
        self.secrets = boto3.client("secretsmanager", region_name=REGION)
        generated = self.secrets.get_random_password(**template.properties("ReportSecret")["GenerateSecretString"])
        self.report_secret_arn = self.secrets.create_secret(
            Name=f"{stack}-report-secret", SecretString=generated["RandomPassword"]
        )["ARN"]

        self.env = {
            "JOBS_TABLE": self.table,
            "EVENT_BUS_NAME": self.bus,
            "CHECKPOINT_BUCKET": self.bucket,
            "JOBS_QUEUE_URL": self.queue_url,
            "LAUNCH_TEMPLATE_ID": self.launch_template,
            "SECURITY_GROUP_ID": self.security_group,
            "SUBNET_IDS": ",".join(self.subnets),
            "ALLOWED_INSTANCE_TYPES": ",".join(self.allowed_instance_types),
            "GPUJOBS_STACK_NAME": stack,
            "CHECKPOINT_DOCUMENT": self.checkpoint_document,
            "REPORT_SECRET_ARN": self.report_secret_arn,
            "JOB_ROLE_ARN": self.job_role_arn,
            "INSTANCE_ROLE_ARN": self.instance_role_arn,
            "CREDENTIALS_FUNCTION": f"{stack}-CredentialsFunction",
            "JOB_LOG_GROUP": self.log_group,
            "REPORTS_FUNCTION_NAME": f"{stack}-ReportsFunction",
            "AWS_REGION": REGION,
        }
        if self.teams is not None:
            self.teams_parameter = f"/{stack}/teams"
            self.ssm.put_parameter(Name=self.teams_parameter, Value=self.teams, Type="String")
            self.env["TEAMS_PARAMETER"] = self.teams_parameter

    def _create_instance_role(self) -> str:
        """The template's InstanceRole in moto's IAM: `instance_credentials` plays EC2's part."""
        trust = json.dumps(template.properties("InstanceRole")["AssumeRolePolicyDocument"])
        iam = boto3.client("iam", region_name=REGION)
        arn: str = iam.create_role(RoleName=f"{self.stack_name}-InstanceRole", AssumeRolePolicyDocument=trust)["Role"][
            "Arn"
        ]
        return arn

    def instance_credentials(self, instance_id: str, *, sts: Any = None) -> dict[str, Any]:
        """The instance role's session EC2 gives `instance_id` (session name: the instance id), as
        STS `Credentials`: what its IMDS would serve, and what GetCallerIdentity names as
        `assumed-role/<InstanceRole>/<instance id>`."""
        sts = sts or boto3.client("sts", region_name=REGION)
        answer = sts.assume_role(RoleArn=self.instance_role_arn, RoleSessionName=instance_id)
        return dict(answer["Credentials"])

    def _create_job_role(self) -> str:
        """The template's JobRole in moto's IAM: instances assume it per attempt (moto STS answers with real keys)."""
        account = "123456789012"
        trust, policy = template.role_documents(
            "JobRole",
            stack_name=self.stack_name,
            attributes={
                "CredentialsFunctionRole.Arn": f"arn:aws:iam::{account}:role/{self.stack_name}-CredentialsFunctionRole",
                "CheckpointBucket.Arn": f"arn:aws:s3:::{self.bucket}",
                "JobsEventBus.Arn": f"arn:aws:events:{REGION}:{account}:event-bus/{self.bus}",
            },
        )
        iam = boto3.client("iam", region_name=REGION)
        name = f"{self.stack_name}-JobRole"
        arn: str = iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        iam.put_role_policy(RoleName=name, PolicyName="gpujobs-job", PolicyDocument=policy)
        return arn

    def invoke(self, name: str, payload: bytes) -> bytes | None:
        """Lambda's synchronous Invoke of a function without event sources (`name`: its name or ARN),
        answered by its real handler: the result as JSON, or None for a function not served here.
        The in-process hook (`_invoke_directly`) and the local Lambda endpoint (`lambda_endpoint`) both
        route through it."""
        function = name.split(":function:", 1)[-1].split(":", 1)[0]
        folder = {f"{self.stack_name}-CredentialsFunction": "credentials"}.get(function)
        if folder is None:
            return None
        arn = f"arn:aws:lambda:{REGION}:123456789012:function:{function}"
        context = LambdaContext(function_name=function, invoked_function_arn=arn)
        result = load_function(folder).handler(json.loads(payload or b"null"), context)
        return json.dumps(result).encode()

    def _invoke_directly(self, request: Any, **_: Any) -> AWSResponse | None:
        """`invoke` at `before-send`: the call is made, recorded and signed as any other."""
        name = urllib.parse.unquote(urllib.parse.urlsplit(request.url).path.split("/functions/", 1)[-1].split("/")[0])
        body = request.body.read() if hasattr(request.body, "read") else request.body
        result = self.invoke(name, body or b"")
        if result is None:
            return None
        return AWSResponse(request.url, 200, HTTPHeaders(), _Raw(result))

    def _answer_what_moto_cannot(self) -> None:
        # Placement groups are not implemented: answered here, as EC2 would.
        self.placement_groups = PlacementGroups(region=REGION)
        self.placement_groups.install(self.on_aws)
        # Spot placement scores: every zone scored alike (local/gpujobs_local/spot_scores.py).
        self.spot_scores = SpotScores(region=REGION)
        self.spot_scores.install(self.on_aws)
        # The Price List: the packaged us-east-1 prices (local/gpujobs_local/price_list.py).
        self.price_list = PriceList(region=REGION)
        self.price_list.install(self.on_aws)
        # Its Lambda runs functions in docker. A direct invocation of the credentials function (the
        # bootstrap's) runs the real handler in this process instead.
        self.on_aws("before-send.lambda.Invoke", self._invoke_directly)

    def on_aws(self, event: str, hook: Callable[..., Any]) -> None:
        """Register a botocore hook for every client the code under test creates from now on."""
        assert boto3.DEFAULT_SESSION is not None  # set up by __post_init__
        boto3.DEFAULT_SESSION.events.register(event, hook)

    def off_aws(self, event: str, hook: Callable[..., Any]) -> None:
        assert boto3.DEFAULT_SESSION is not None
        boto3.DEFAULT_SESSION.events.unregister(event, hook)

    # ---- the event source mapping --------------------------------------------------------
    def send(self, body: str | dict[str, Any]) -> str:
        text = body if isinstance(body, str) else json.dumps(body)
        return str(self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=text)["MessageId"])

    def deliver(
        self, handler: Callable[[dict[str, Any], Any], Any], *, rounds: int = 1, sender: str | None = None
    ) -> list[dict[str, Any]]:
        """Up to `rounds` receive/invoke cycles; returns each invocation's response. `sender`: the
        SenderId the messages carry instead of moto's own (a message sent by that principal)."""
        responses = []
        for _ in range(rounds):
            messages = self.sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=10,
                VisibilityTimeout=0,
                AttributeNames=["All"],
            ).get("Messages", [])
            if not messages:
                break
            if sender is not None:
                messages = [{**m, "Attributes": {**m.get("Attributes", {}), "SenderId": sender}} for m in messages]
            try:
                response = handler(self.sqs_event(messages), LambdaContext()) or {"batchItemFailures": []}
            except Exception:
                response = {"batchItemFailures": [{"itemIdentifier": m["MessageId"]} for m in messages]}
            responses.append(response)
            failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
            for message in messages:
                if message["MessageId"] not in failed:
                    self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        return responses

    def eventbridge(
        self, source: str, detail_type: str, detail: dict[str, Any], resources: list[str] | None = None
    ) -> dict[str, Any]:
        """An EventBridge event as Lambda receives it from a rule."""
        return {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": source,
            "account": "123456789012",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": REGION,
            "resources": resources or [],
            "detail": detail,
        }

    def sqs_event(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        arn = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        return {
            "Records": [
                {
                    "messageId": m["MessageId"],
                    "receiptHandle": m["ReceiptHandle"],
                    "body": m["Body"],
                    "attributes": m.get("Attributes", {}),
                    "messageAttributes": {},
                    "md5OfBody": m["MD5OfBody"],
                    "eventSource": "aws:sqs",
                    "eventSourceARN": arn,
                    "awsRegion": REGION,
                }
                for m in messages
            ]
        }

    # ---- what a user would look at ---------------------------------------------------------
    def instances(self, **filters: str) -> list[dict[str, Any]]:
        flt = [{"Name": "instance-state-name", "Values": list(UP_STATES)}]
        flt += [{"Name": f"tag:{k}", "Values": [v]} for k, v in filters.items()]
        pages = self.ec2.describe_instances(Filters=flt)["Reservations"]
        return [i for r in pages for i in r["Instances"]]

    def user_data(self, instance_id: str) -> bytes:
        value = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
        raw = base64.b64decode(value)
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw

    def signed_by(self, instance_id: str, detail_type: str, detail: dict[str, Any]) -> dict[str, Any]:
        """`detail` with the proof the instance's own code would add: signed now with the report key
        in its user data (`gpujobs.domain.report_auth`)."""
        key = bytes.fromhex(extract_run_json(self.user_data(instance_id))["report_key"])
        signed_at = int(time.time())
        return {**detail, "signed_at": signed_at, "signature": sign(key, detail_type, detail, signed_at=signed_at)}

    def dead_letters(self) -> list[dict[str, Any]]:
        return list(self.sqs.receive_message(QueueUrl=self.dlq_url, MaxNumberOfMessages=10).get("Messages", []))

    def publish_state_changes(self) -> list[dict[str, Any]]:
        """Play the Publisher function's stream mapping (template.yaml `PublisherFunction`): read the
        table's stream past what was published and invoke the real handler on each batch; returns
        each invocation's response. A batch that reports a failure is left for the next call."""
        reader = self.table_stream()
        handler = load_function("publisher").handler
        responses = []
        while (batch := reader.next_batch()) is not None:
            context = LambdaContext(function_name=f"{self.stack_name}-PublisherFunction")
            response = handler(batch.event, context)
            responses.append(response)
            if not reader.finished(batch, response, failed=False):
                break
        return responses

    def table_stream(self) -> TableStream:
        """The table's stream as the Publisher function's mapping reads it (one reader, kept)."""
        if self._stream is None:
            streams = boto3.client("dynamodbstreams", region_name=REGION, config=_NO_ACCOUNT_ENDPOINT)
            arn = self.ddb.describe_table(TableName=self.table)["Table"]["LatestStreamArn"]
            (mapping,) = template.event_sources("PublisherFunction", "DynamoDB").values()
            self._stream = TableStream(
                client=streams, stream_arn=arn, batch_size=int(mapping["BatchSize"]), filters=filter_patterns(mapping)
            )
        return self._stream

    def observed_events(self, *, publish: bool = True) -> list[dict[str, Any]]:
        """What a subscriber of the bus has heard since it last looked, once the Publisher function
        has read the stream (`publish`: False looks without reading it first)."""
        if publish:
            self.publish_state_changes()
        seen: list[dict[str, Any]] = []
        while True:
            batch = self.sqs.receive_message(QueueUrl=self.events_queue, MaxNumberOfMessages=10).get("Messages", [])
            if not batch:
                return seen
            for m in batch:
                seen.append(json.loads(m["Body"]))
                self.sqs.delete_message(QueueUrl=self.events_queue, ReceiptHandle=m["ReceiptHandle"])


class _Raw(io.BytesIO):
    """An HTTP body as botocore reads it: whole (`stream`) or as a streaming payload (`read`)."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.getvalue()


def _an_amazon_image(ec2: Any) -> str:
    """An Amazon AMI id. moto's first default AMI is asked for by id first: listing all ~1300 of them
    takes a second and a half (and returns that same one first)."""
    with contextlib.suppress(ClientError):
        images = ec2.describe_images(Owners=["amazon"], ImageIds=[MOTO_FIRST_AMAZON_AMI])["Images"]
        if images:
            return str(images[0]["ImageId"])
    return str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])


def load_function(name: str) -> ModuleType:
    """Import functions/<name>/app.py under a unique module name, as Lambda loads a handler."""
    path = ROOT / "functions" / name / "app.py"
    spec = importlib.util.spec_from_file_location(f"functions_{name}_app", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no handler at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
