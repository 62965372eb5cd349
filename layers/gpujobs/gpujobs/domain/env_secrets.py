"""Credentials in a submitted spec's `env`, found by a maintained rule set and by their names.

A job's `env` is stored in the jobs table, rendered into the run document and shown by `gpujobs
status --json`: a credential there leaks to whoever can read any of those. The spec's `secrets:`
field is the way to pass one. Three rules refuse a value at submission, each naming the variable
and never quoting the value:

1. **Its shape** (`credentials.credential_kind`, checked on every read of a spec as before, and
   Yelp's detect-secrets plugins, checked at submission): the vendors' token formats
   detect-secrets maintains (AWS, GitHub, GitLab, Slack, Stripe, OpenAI, PyPI, npm, Twilio,
   SendGrid, Discord, Telegram, JWTs, private keys, basic-auth URLs ...). Its entropy plugins and
   its public-IP plugin are left out: a 40-hex commit id or a master's address is not a secret.
   Hugging Face tokens are this module's own rule (detect-secrets has none): `hf_` and at least 8
   letters and digits, so a short one is caught too.
2. **A name that says it is a credential**, whatever the value (empty and yes/no-like values
   aside): the last words `PASSWORD`, `PASSWD`, `PASSPHRASE`, `SECRET`, `CREDENTIAL(S)`, or
   `API_KEY`, `ACCESS_KEY`, `SECRET_KEY`, `PRIVATE_KEY`, `AUTH_KEY`, `CLIENT_SECRET`, `API_TOKEN`,
   `AUTH_TOKEN`, `ACCESS_TOKEN`, `REFRESH_TOKEN`, `SESSION_TOKEN`, `BEARER_TOKEN` (`WANDB_API_KEY`,
   `DB_PASSWORD`). A reference (`ssm:/...`) under such a name is refused too: it belongs in `secrets:`.
3. **A name ending in `_KEY` or `_TOKEN` (or named so) with a value that looks random**: 16 or more
   characters, no space, letters and digits, not words joined by `-`, `_` or `.`. So `HF_TOKEN` with
   a token is refused, `PAD_TOKEN: <pad>`, `SORT_KEY: step` or `MODEL_KEY: bert-base-uncased-v2`
   are not.

These are a net for mistakes, not a proof that a value is harmless. Rules 1 (detect-secrets) to 3
run only when a spec is submitted (`validate_spec` gives a validation context), never when a stored
job is read back: a record accepted before a rule existed stays readable, and reading jobs never
imports detect-secrets (about 0.3 s, paid once by the first submission with an `env`).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from gpujobs.domain.credentials import credential_kind

_CREDENTIAL_NAME = re.compile(
    r"(?:^|_)(?:PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIALS?"
    r"|(?:API|ACCESS|SECRET|PRIVATE|AUTH)_?KEY|CLIENT_SECRET"
    r"|(?:API|AUTH|ACCESS|REFRESH|SESSION|BEARER)_?TOKEN)$"
)
_KEY_OR_TOKEN_NAME = re.compile(r"(?:^|_)(?:KEY|TOKEN)$")
_NOT_A_VALUE = frozenset({"", "0", "1", "true", "false", "yes", "no", "on", "off", "none", "null"})
_RANDOM_LOOKING = re.compile(r"(?=[^\s]*[0-9])(?=[^\s]*[A-Za-z])[^\s]{16,}")
_WORDS = re.compile(r"[a-z]+(?:[-_.][a-z0-9]+)*")
_HUGGING_FACE = re.compile(r"\bhf_([A-Za-z0-9]{8,})")
_NOT_CREDENTIALS = frozenset({"IPPublicDetector"})
"""detect-secrets' regex plugins left out: a public IPv4 address (a master's) is no credential."""


def env_credential_problems(env: Mapping[str, str], *, submitted: bool) -> list[str]:
    """One problem for each variable of `env` that holds a credential; `submitted`: all the rules,
    else only the shapes a stored spec was always checked for."""
    problems = []
    for name, value in env.items():
        kind = credential_kind(name, value, env) or (_submitted_kind(name, value) if submitted else None)
        if kind is not None:
            problems.append(
                f"{name!r} looks like {kind}: pass credentials with the spec's `secrets:` field, never in env"
            )
    return problems


def _submitted_kind(name: str, value: str) -> str | None:
    if value.strip().lower() in _NOT_A_VALUE:
        return None
    if _CREDENTIAL_NAME.search(name):
        return "a credential (its name says so)"
    if _KEY_OR_TOKEN_NAME.search(name) and _RANDOM_LOOKING.fullmatch(value) and not _WORDS.fullmatch(value):
        return "a key or token (its name says so and the value looks random)"
    found = _HUGGING_FACE.search(value)
    if found and any(c.isdigit() for c in found.group(1)) and any(c.isalpha() for c in found.group(1)):
        return "a Hugging Face token"
    return next(_detected(value), None)


def _detected(value: str) -> Iterator[str]:
    """detect-secrets' name for each kind of secret its regex plugins find in `value`."""
    for secret_type, plugin in _plugins():
        if any(True for _ in plugin.analyze_string(value)):
            yield f"{secret_type} (a detect-secrets rule)"


@cache
def _plugins() -> tuple[tuple[str, Any], ...]:
    """Every regex plugin detect-secrets ships (but `_NOT_CREDENTIALS`), imported on first use."""
    # Here, not at the top: reading jobs back never needs it, and it costs about 0.3 s to import.
    import detect_secrets.plugins
    from detect_secrets.plugins.base import RegexBasedDetector

    found: dict[str, Any] = {}
    for module in pkgutil.iter_modules(detect_secrets.plugins.__path__):
        loaded = importlib.import_module(f"detect_secrets.plugins.{module.name}")
        for cls in vars(loaded).values():
            if (
                inspect.isclass(cls)
                and issubclass(cls, RegexBasedDetector)
                and not inspect.isabstract(cls)
                and cls.__name__ not in _NOT_CREDENTIALS
            ):
                found[cls.__name__] = (str(cls.secret_type), cls())
    return tuple(found[name] for name in sorted(found))
