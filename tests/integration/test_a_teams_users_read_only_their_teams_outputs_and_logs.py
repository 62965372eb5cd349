"""A team's users download and read the logs of their team's jobs, and of no other team's.

Enforced on moto with IAM on: each team's IAM user holds exactly `user_access.team_user_policy`
(the document docs/security.md shows) and runs the real CLI. moto matches S3 resources as IAM does;
for CloudWatch Logs and DynamoDB it matches every request as `*`, so the fixture gives those two
responses the ARN IAM authorizes (the Service Authorization Reference: `GetLogEvents` on the
`log-stream` ARN, `DescribeLogStreams` on the `log-group`, `GetItem` on the table). moto ignores
conditions, so the listing's `s3:prefix` condition is asserted with tests/iam's evaluator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws, settings
from moto.core.authorization import ActionAuthenticatorMixin
from moto.dynamodb.responses import DynamoHandler
from moto.logs.responses import LogsResponse

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.contract import job_log_group, job_log_stream, outputs_prefix
from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.spec import load_spec
from gpujobs.domain.user_access import NotATeamError, team_user_policy
from gpujobs_cli.main import main
from gpujobs_local.template import table_definition
from tests.iam.evaluate import Request, evaluate

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ACCOUNT, REGION = "123456789012", "us-east-1"
BUCKET, TABLE, GROUP = "gpujobs-checkpoints", "gpujobs-jobs", job_log_group("gpujobs")
GROUP_ARN = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{GROUP}"
TABLE_ARN = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{TABLE}"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
JOBS = {"vision": "j-000000000000000a", "speech": "j-000000000000000b"}


def policy_of(team: str) -> dict[str, Any]:
    return team_user_policy(
        team=team,
        bucket=BUCKET,
        table_arn=TABLE_ARN,
        queue_arn=f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpujobs-jobs",
        log_group_arn=GROUP_ARN,
        stack_arn=f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/gpujobs/*",
        shell_document_arn=f"arn:aws:ssm:{REGION}:{ACCOUNT}:document/gpujobs-ShellDocument-abc",
        exec_document_arn=f"arn:aws:ssm:{REGION}:{ACCOUNT}:document/gpujobs-ExecDocument-abc",
    )


def _logs_resource(self: Any) -> str:
    group, stream = self._get_param("logGroupName"), self._get_param("logStreamName")
    return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}" + (f":log-stream:{stream}" if stream else ":*")


def _table_resource(self: Any) -> str:
    return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{self.body.get('TableName', '')}"


@dataclass
class Users:
    keys: dict[str, dict[str, str]]

    def as_(self, team: str, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", self.keys[team]["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", self.keys[team]["SecretAccessKey"])


@pytest.fixture
def users(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Users]:
    """Two teams' finished jobs, each with outputs and a log; one IAM user per team with its policy."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "GPUJOBS_BUCKET": BUCKET,
        "GPUJOBS_TABLE": TABLE,
        "GPUJOBS_LOG_GROUP": GROUP,
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "GPUJOBS_STACK", "GPUJOBS_QUEUE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(LogsResponse, "_determine_resource", _logs_resource, raising=False)
    monkeypatch.setattr(DynamoHandler, "_determine_resource", _table_resource, raising=False)
    monkeypatch.chdir(tmp_path)
    # IAM on after the three calls that make an administrator (moto's set_initial_no_auth_action_count)
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 3)
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
    with mock_aws():
        admin = _admin()
        s3, ddb, logs = admin.client("s3"), admin.client("dynamodb"), admin.client("logs")
        s3.create_bucket(Bucket=BUCKET)
        ddb.create_table(**table_definition(table_name=TABLE))
        logs.create_log_group(logGroupName=GROUP)
        store = DynamoJobStore(table_name=TABLE, client=ddb)
        spec = load_spec((EXAMPLES / "digits.yaml").read_bytes())
        iam = admin.client("iam")
        keys = {}
        for team, job_id in JOBS.items():
            job = store.create(
                Job.submitted(job_id=job_id, spec=spec.model_copy(update={"team": team}), now=NOW, message_id=None)
            )
            store.save(job.model_copy(update={"attempts": (Attempt(number=1, started_at=NOW, instance_ids=("i-1",)),)}))
            s3.put_object(Bucket=BUCKET, Key=outputs_prefix(job_id, team=team) + "model.bin", Body=team.encode())
            stream = job_log_stream(job_id, 1, 0, team=team)
            logs.create_log_stream(logGroupName=GROUP, logStreamName=stream)
            events = [{"timestamp": int(NOW.timestamp() * 1000), "message": f"{team} training"}]
            logs.put_log_events(logGroupName=GROUP, logStreamName=stream, logEvents=events)
            iam.create_user(UserName=team)
            iam.put_user_policy(UserName=team, PolicyName="gpujobs", PolicyDocument=json.dumps(policy_of(team)))
            keys[team] = iam.create_access_key(UserName=team)["AccessKey"]
        yield Users(keys)


def _admin() -> boto3.session.Session:
    iam = boto3.client("iam")
    iam.create_user(UserName="admin")
    everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=json.dumps(everything))
    key = iam.create_access_key(UserName="admin")["AccessKey"]
    return boto3.session.Session(
        aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"], region_name=REGION
    )


def test_a_teams_user_downloads_its_teams_outputs_and_not_anothers(
    users: Users, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    users.as_("vision", monkeypatch)

    assert main(["download", JOBS["vision"], "mine"]) == 0
    assert (tmp_path / "mine" / "model.bin").read_bytes() == b"vision"

    assert main(["download", JOBS["speech"], "theirs"]) != 0
    err = capsys.readouterr().err
    assert "403" in err or "AccessDenied" in err, err
    assert not (tmp_path / "theirs" / "model.bin").exists()


def test_a_teams_user_reads_its_teams_logs_and_not_anothers(
    users: Users, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    users.as_("vision", monkeypatch)

    assert main(["logs", JOBS["vision"]]) == 0
    assert capsys.readouterr().out == "vision training\n"

    assert main(["logs", JOBS["speech"]]) != 0
    out, err = capsys.readouterr()
    assert "speech training" not in out
    assert "AccessDenied" in err, err


def test_listing_another_teams_outputs_is_refused_by_the_prefix_condition() -> None:
    # moto ignores conditions: judged by IAM's evaluation rules (tests/iam/evaluate.py)
    statements = policy_of("vision")["Statement"]

    def listing(prefix: str) -> bool:
        request = Request("s3:ListBucket", f"arn:aws:s3:::{BUCKET}", {"s3:prefix": [prefix]}, {"s3:prefix"})
        return evaluate(statements, request).allowed

    assert listing(outputs_prefix(JOBS["vision"], team="vision"))
    assert not listing(outputs_prefix(JOBS["speech"], team="speech"))
    assert not listing("jobs/")
    assert not listing(outputs_prefix(JOBS["speech"], team=None))


def test_a_teams_users_get_shells_and_commands_only_on_their_teams_instances_through_the_stacks_documents() -> None:
    """Judged by tests/iam's evaluator (moto does not authorize SSM sessions): StartSession and
    SendCommand are authorized on the instance and on the document, each on its own."""
    statements = policy_of("vision")["Statement"]
    documents = f"arn:aws:ssm:{REGION}:{ACCOUNT}:document/gpujobs-"

    def allowed(
        action: str, resource: str, *, team: str = "vision", stack: str = "gpujobs", check: bool = True
    ) -> bool:
        context = {"ssm:resourcetag/gpujobs:team": [team], "ssm:resourcetag/gpujobs:stack": [stack]}
        if action == "ssm:StartSession":
            context["ssm:sessiondocumentaccesscheck"] = [str(check).lower()]
        request = Request(action, resource, context, set(context))
        return evaluate(statements, request).allowed

    instance = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0000000000000000a"
    assert allowed("ssm:StartSession", instance)
    assert allowed("ssm:StartSession", documents + "ShellDocument-abc")
    assert allowed("ssm:SendCommand", instance)
    assert allowed("ssm:SendCommand", documents + "ExecDocument-abc")
    # another team's instance, another stack's, a session whose document is not checked
    assert not allowed("ssm:StartSession", instance, team="speech")
    assert not allowed("ssm:SendCommand", instance, team="speech")
    assert not allowed("ssm:StartSession", instance, stack="other")
    assert not allowed("ssm:StartSession", instance, check=False)
    # any other document: the agent's default host shell, AWS's shell scripts, the checkpoint document
    for other in ("SSM-SessionManagerRunShell", "AWS-StartInteractiveCommand"):
        assert not allowed("ssm:StartSession", f"arn:aws:ssm:{REGION}::document/{other}")
    assert not allowed("ssm:SendCommand", f"arn:aws:ssm:{REGION}::document/AWS-RunShellScript")
    assert not allowed("ssm:SendCommand", documents + "CheckpointNowDocument-abc")
    assert not allowed("ssm:SendCommand", documents + "ShellDocument-abc")


def test_no_policy_is_rendered_for_a_name_that_is_no_team_or_could_be_a_job() -> None:
    for name in ("Vision", "a:b", "a*", "j-0123456789abcdef", ""):
        with pytest.raises(NotATeamError):
            policy_of(name)


def test_the_policy_docs_security_md_shows_is_the_one_rendered_and_tested_here() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text(encoding="utf-8")
    block = text.split("<!-- team-user-policy:", 1)[1].split("```json\n", 1)[1].split("\n```", 1)[0]
    shown = team_user_policy(
        team="vision",
        bucket="gpujobs-checkpoints-abc",
        table_arn=f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpujobs-jobs",
        queue_arn=f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpujobs-jobs",
        log_group_arn=f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/gpujobs/gpujobs/jobs",
        stack_arn=f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/gpujobs/*",
        shell_document_arn=f"arn:aws:ssm:{REGION}:{ACCOUNT}:document/gpujobs-ShellDocument-abc",
        exec_document_arn=f"arn:aws:ssm:{REGION}:{ACCOUNT}:document/gpujobs-ExecDocument-abc",
    )

    assert json.loads(block) == shown
    assert [s["Sid"] for s in shown["Statement"]] == [s["Sid"] for s in policy_of("vision")["Statement"]]
