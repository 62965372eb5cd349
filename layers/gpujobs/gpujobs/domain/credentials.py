"""Values that look like credentials, so that a spec never carries one in `env`.

A job's `env` is stored in the jobs table, rendered into user data and shown by `gpujobs status
--json`; a credential put there leaks to everyone who can read any of those. The spec's `secrets:`
field is the way to pass one (resolved on the instance, never stored). These patterns are the
well-known shapes of tokens; they are a net for mistakes, not a proof that a value is harmless.
`redact` keeps the same shapes out of what a REJECTED record echoes of the submission.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_SHAPES: dict[str, str] = {
    "an AWS access key id": r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b",
    "a Hugging Face token": r"\bhf_[A-Za-z0-9]{30,}",
    "a GitHub token": r"\b(?:ghp_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{22,})",
    "an API secret key (sk-...)": r"\bsk-[A-Za-z0-9_-]{20,}",
    "a Slack token": r"\bxox[bp]-[A-Za-z0-9-]{10,}",
}
_ANY_SHAPE = re.compile("|".join(f"(?:{p})" for p in _SHAPES.values()))
_AWS_SECRET = r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"  # noqa: S105 (a pattern, not a password)
"""An AWS secret access key: 40 base64 characters. Common enough by chance that it counts only
next to an access key id (in the same env) or under a name that says what it is."""
_SECRET_NAME = re.compile(r"SECRET_?ACCESS_?KEY", re.IGNORECASE)
_AWS_KEY_ID = re.compile(_SHAPES["an AWS access key id"])


def credential_kind(name: str, value: str, env: Mapping[str, str]) -> str | None:
    """What credential `value` (the env variable `name` in `env`) looks like, or None."""
    for kind, pattern in _SHAPES.items():
        if re.search(pattern, value):
            return kind
    if re.search(_AWS_SECRET, value) and (
        _SECRET_NAME.search(name) or any(_AWS_KEY_ID.search(v) for v in env.values())
    ):
        return "an AWS secret access key"
    return None


def redact(text: str) -> str:
    """`text` with every credential-shaped token replaced by `[redacted]` (40-character base64 runs
    too, when the text also holds an access key id or names a secret access key)."""
    if _AWS_KEY_ID.search(text) or _SECRET_NAME.search(text):
        text = re.sub(_AWS_SECRET, "[redacted]", text)
    return _ANY_SHAPE.sub("[redacted]", text)
