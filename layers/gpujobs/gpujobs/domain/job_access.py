"""What one attempt's container may touch: the job role's session policy and session tags.

The instance assumes the stack's job role for each attempt (`gpujobs.instance.credentials`). Two
policies bound what that session can do, and it gets only what both allow:
* the role's own policy (template.yaml `JobRole`), written against the session tags
  (`${aws:PrincipalTag/gpujobs:job-id}`, `.../gpujobs:team`): any session of the role reaches only
  the prefix and the secrets its tags name;
* the inline session policy rendered here, naming this job's prefix, its outputs prefix (write
  only: the bootstrap uploads the job's output folder there), this team's secrets and data
  buckets: the only place that knows which buckets a team owns (the team configuration).
A mistake in either one alone does not widen what a job can touch. Rendered by the control plane
(pure, tested here) and carried in the run document, so the bootstrap only passes it to STS.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gpujobs.contract import ATTEMPT_TAG, JOB_TAG, SECRET_NAME_PREFIX, TEAM_TAG, TRAINER_SOURCE, outputs_prefix

MAX_SESSION_POLICY_CHARS = 2048
"""STS's limit on the plaintext of an inline session policy."""
JOB_OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
OUTPUT_OBJECT_ACTIONS = ("s3:PutObject", "s3:AbortMultipartUpload")
"""A job writes its outputs and never reads or deletes them: they are the user's, once written."""


class SessionPolicyTooLargeError(ValueError):
    """The policy would not fit STS's limit (a team with very many data buckets)."""


def job_prefix(job_id: str) -> str:
    """The job's folder in the checkpoint bucket: checkpoints, run documents, anything it writes."""
    return f"jobs/{job_id}/"


def outputs_uri(*, bucket: str, job_id: str, team: str) -> str:
    """`s3://<bucket>/outputs/<team>/<job-id>/`: where the job's output folder is uploaded (the run document's)."""
    return f"s3://{bucket}/{outputs_prefix(job_id, team=team)}"


def session_policy(
    *, bucket: str, job_id: str, team: str, data_buckets: Iterable[str] = (), partition: str = "aws"
) -> dict[str, Any]:
    """The inline session policy of one attempt: its job's prefix, its team's secrets and data buckets."""
    prefix = job_prefix(job_id)
    statements: list[dict[str, Any]] = [
        {
            "Sid": "OwnJobPrefix",
            "Effect": "Allow",
            "Action": list(JOB_OBJECT_ACTIONS),
            "Resource": f"arn:{partition}:s3:::{bucket}/{prefix}*",
        },
        {
            "Sid": "WriteOwnJobOutputs",
            "Effect": "Allow",
            "Action": list(OUTPUT_OBJECT_ACTIONS),
            "Resource": f"arn:{partition}:s3:::{bucket}/{outputs_prefix(job_id, team=team)}*",
        },
        {
            "Sid": "ListOwnJobPrefix",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": f"arn:{partition}:s3:::{bucket}",
            "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
        },
        {
            "Sid": "TrainerEvents",
            "Effect": "Allow",
            "Action": "events:PutEvents",
            "Resource": "*",
            "Condition": {"StringEquals": {"events:source": TRAINER_SOURCE}},
        },
        {
            "Sid": "TeamSecrets",
            "Effect": "Allow",
            "Action": ["secretsmanager:GetSecretValue", "ssm:GetParameter"],
            "Resource": [
                f"arn:{partition}:secretsmanager:*:*:secret:{SECRET_NAME_PREFIX}{team}/*",
                f"arn:{partition}:ssm:*:*:parameter/{SECRET_NAME_PREFIX}{team}/*",
            ],
        },
    ]
    data = [f"arn:{partition}:s3:::{b}" for b in sorted(set(data_buckets))]
    if data:
        statements.append(
            {
                "Sid": "TeamDataBuckets",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:ListBucket"],
                "Resource": [*data, *(f"{arn}/*" for arn in data)],
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


def session_policy_json(**kwargs: Any) -> str:
    """`session_policy(**kwargs)` as compact JSON; SessionPolicyTooLargeError over STS's limit."""
    text = json.dumps(session_policy(**kwargs), separators=(",", ":"))
    if len(text) > MAX_SESSION_POLICY_CHARS:
        raise SessionPolicyTooLargeError(
            f"the job's session policy is {len(text)} characters, over STS's {MAX_SESSION_POLICY_CHARS}"
        )
    return text


def session_tags(*, job_id: str, team: str, attempt: int) -> dict[str, str]:
    """The job role's session tags: its policy scopes the job's prefix and team's secrets by them."""
    return {JOB_TAG: job_id, TEAM_TAG: team, ATTEMPT_TAG: str(attempt)}
