"""What one team's users may read and send: the IAM policy docs/security.md gives them.

A job's outputs are `outputs/<team>/<job-id>/` and its log streams `<team>/<job-id>/...`
(`gpujobs.contract`), so IAM can give a team's users exactly its own: `s3:GetObject` on
`outputs/<team>/*`, `s3:ListBucket` only with `s3:prefix` under it, `logs:GetLogEvents` on the
streams `<team>/*`, and `gpujobs shell`/`exec` (SSM StartSession and SendCommand) only with the
stack's own documents and only on instances tagged with the team. What IAM cannot scope by team today is said in the policy itself:

* the jobs table is keyed by job id, so `dynamodb:LeadingKeys` cannot name a team: the user reads
  every team's job records (`status`, `list`, and the team lookup of `logs` and `download`);
* `logs:DescribeLogStreams` is granted on the log group, not a stream: stream *names* of every team
  are listed, never their lines;
* submit and cancel are SQS messages; the control plane, not IAM, decides by the sender's id
  whether they act for the team (`gpujobs.domain.teams`).

Pure: the docs show its rendering (a test keeps them equal) and the test that proves it on moto
uses it, so the document shipped and the document tested are one.
"""

from __future__ import annotations

import re
from typing import Any

from gpujobs.contract import OUTPUTS_PREFIX, STACK_TAG, TEAM_TAG
from gpujobs.domain.job_ids import JOB_ID
from gpujobs.domain.spec import TEAM_PATTERN


class NotATeamError(ValueError):
    """The name is no team's: not a valid team name, or one a job id could be mistaken for."""


def team_user_policy(
    *,
    team: str,
    bucket: str,
    table_arn: str,
    queue_arn: str,
    log_group_arn: str,
    stack_arn: str,
    shell_document_arn: str,
    exec_document_arn: str,
    partition: str = "aws",
) -> dict[str, Any]:
    """The identity policy of team `team`'s users. `log_group_arn` without a trailing `:*`; the
    documents are the stack's outputs `ShellDocumentName` and `ExecDocumentName`, as SSM ARNs."""
    if re.fullmatch(TEAM_PATTERN, team) is None or JOB_ID.fullmatch(team):
        # A team named like a job id would reach that job's outputs of the release before teams.
        raise NotATeamError(f"{team!r} is not a team name (or is shaped like a job id)")
    bucket_arn = f"arn:{partition}:s3:::{bucket}"
    team_outputs = f"{OUTPUTS_PREFIX}{team}/"
    _, _, _, region, account, _ = shell_document_arn.split(":", 5)
    stack = stack_arn.split(":stack/", 1)[1].split("/", 1)[0]
    team_instances = f"arn:{partition}:ec2:{region}:{account}:instance/*"
    team_tags = {"StringEquals": {f"ssm:resourceTag/{TEAM_TAG}": team, f"ssm:resourceTag/{STACK_TAG}": stack}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadTeamOutputs",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": f"{bucket_arn}/{team_outputs}*",
            },
            {
                "Sid": "ListTeamOutputs",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{team_outputs}*"]}},
            },
            {
                "Sid": "ReadTeamLogStreams",
                "Effect": "Allow",
                "Action": "logs:GetLogEvents",
                "Resource": f"{log_group_arn}:log-stream:{team}/*",
            },
            {
                "Sid": "FindLogStreamsOfEveryTeam",
                "Effect": "Allow",
                "Action": "logs:DescribeLogStreams",
                "Resource": f"{log_group_arn}:*",
            },
            {
                "Sid": "ReadJobRecordsOfEveryTeam",
                "Effect": "Allow",
                "Action": ["dynamodb:GetItem", "dynamodb:Query"],
                "Resource": [table_arn, f"{table_arn}/index/*"],
            },
            {
                "Sid": "SubmitAndCancelCheckedByTheControlPlane",
                "Effect": "Allow",
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
            },
            {
                "Sid": "FindTheStack",
                "Effect": "Allow",
                "Action": "cloudformation:DescribeStacks",
                "Resource": stack_arn,
            },
            {
                # SessionDocumentAccessCheck: the session's document needs an allow of its own, so
                # a session without one (the agent's default, a root shell on the host) is refused.
                "Sid": "ShellsOnTeamInstancesOnly",
                "Effect": "Allow",
                "Action": "ssm:StartSession",
                "Resource": team_instances,
                "Condition": {**team_tags, "BoolIfExists": {"ssm:SessionDocumentAccessCheck": "true"}},
            },
            {
                "Sid": "WithTheStacksShellDocument",
                "Effect": "Allow",
                "Action": "ssm:StartSession",
                "Resource": shell_document_arn,
            },
            {
                "Sid": "ExecOnTeamInstancesOnly",
                "Effect": "Allow",
                "Action": "ssm:SendCommand",
                "Resource": team_instances,
                "Condition": team_tags,
            },
            {
                "Sid": "WithTheStacksExecDocument",
                "Effect": "Allow",
                "Action": "ssm:SendCommand",
                "Resource": exec_document_arn,
            },
            {
                "Sid": "ReadExecResults",
                "Effect": "Allow",
                "Action": "ssm:GetCommandInvocation",
                "Resource": "*",
            },
            {
                "Sid": "EndOwnSessions",
                "Effect": "Allow",
                "Action": ["ssm:TerminateSession", "ssm:ResumeSession"],
                "Resource": f"arn:{partition}:ssm:*:{account}:session/${{aws:username}}-*",
            },
        ],
    }
