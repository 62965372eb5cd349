"""The credentials function's payload, as the instance bootstrap sends it (`gpujobs.instance.credentials`).

A direct invocation has no envelope: the payload is the request. Bounded, so that a caller cannot
make the function forward an arbitrary body or headers to STS; everything in it is checked again
(`domain.job_sessions.proof_problem`) and nothing in it names what the session may do.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpujobs.domain.job_sessions import SessionAsk


class SessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    attempt: int = Field(ge=1)
    headers: dict[str, str] = Field(max_length=32)
    body: str = Field(max_length=256)

    def ask(self) -> SessionAsk:
        return SessionAsk(job_id=self.job_id, attempt=self.attempt, headers=dict(self.headers), body=self.body)
