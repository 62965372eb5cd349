"""The job's secrets: resolved on the instance, at start, with the job's own credentials.

The spec and the run document carry references only (`arn:aws:secretsmanager:...` or
`ssm:/path`), so user data, the jobs table, S3 and events never hold a value. The bootstrap reads
each value with the job role's session, whose policy admits only the team's secrets
(`gpujobs/<team>/...`), and hands the values to the workload privately: for docker, a 0600 env
file in a 0700 folder (`docker run --env-file`, which carries the job's whole environment), never
the docker client's environment or argv;
for the process runtime, the child's environment only. Errors name the variable and the
reference, never a value.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from gpujobs.instance.aws import Clients
from gpujobs.instance.errors import BootstrapError

SECRETS_MANAGER_PREFIX = "arn:aws:secretsmanager:"
SSM_PREFIX = "ssm:"


def resolve_secrets(refs: dict[str, str], clients: Clients) -> dict[str, str]:
    """NAME -> value for every reference, read with `clients` (the job's credentials)."""
    values = {}
    for name, ref in sorted(refs.items()):
        try:
            values[name] = _read(ref, clients)
        except Exception as exc:  # the message names the reference; a value is never in it
            raise BootstrapError(f"cannot read secret {name} from {ref}: {type(exc).__name__}") from None
    return values


def _read(ref: str, clients: Clients) -> str:
    if ref.startswith(SECRETS_MANAGER_PREFIX):
        return str(clients("secretsmanager").get_secret_value(SecretId=ref)["SecretString"])
    if ref.startswith(SSM_PREFIX + "/"):
        parameter = clients("ssm").get_parameter(Name=ref[len(SSM_PREFIX) :], WithDecryption=True)
        return str(parameter["Parameter"]["Value"])
    raise BootstrapError(f"secret reference {ref!r} is neither a Secrets Manager ARN nor ssm:/path")


def refuse_line_breaks(values: dict[str, str]) -> None:
    """docker's `--env-file` is read line by line: a value holding a line break cannot travel in it."""
    bad = sorted(name for name, value in values.items() if "\n" in value or "\r" in value)
    if bad:
        raise BootstrapError(f"{', '.join(bad)}: a line break cannot travel in docker's --env-file")


class EnvFile:
    """A private env file for `docker run --env-file`: 0600 in a fresh 0700 folder, removed by `close`.

    docker passes each value on as it is (no quotes, no trimming), one `NAME=value` per line."""

    def __init__(self, values: dict[str, str]) -> None:
        refuse_line_breaks(values)
        self.folder = tempfile.mkdtemp(prefix="gpujobs-env-")  # mode 0700
        self.path = os.path.join(self.folder, "env")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(f"{name}={value}\n" for name, value in sorted(values.items()))

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
