"""Reports from instances: act on one only once it proves it comes from the attempt it names.

The proof (`domain.report_auth`) is checked before the job is even read: a forged report costs one
key derivation, never a store read or a write, and is answered `UNPROVEN_REPORT` with the metric
`ForgedReports` (a proof that is missing, wrong or stale looks the same from outside: all three are
counted, and the detail logged says which). The keys are those of the stack secret's current version
and, while a rotation's grace lasts, its previous one; a signature that matches neither makes the
container re-read the secret once (it may have been rotated since it was cached). A proven report goes on to its reaction, whose decision
still judges it on the record (an ended attempt's report changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpujobs.domain.effects import Outcome
from gpujobs.domain.report_auth import Proof, verify_any
from gpujobs.domain.reports import SignedReport
from gpujobs.service.ports import Ports
from gpujobs.service.reactions import Reaction, Reactions


@dataclass
class Reports:
    ports: Ports
    reactions: Reactions

    def receive(self, signed: SignedReport) -> Reaction:
        report = signed.report
        proof = self._proof(signed)
        if proof is Proof.MISMATCH and self.ports.report_keys.refresh():
            proof = self._proof(signed)  # the secret was rotated since this container read it
        if proof is not Proof.VALID:
            return Reaction(
                Outcome.UNPROVEN_REPORT,
                metrics={"ForgedReports": 1},
                detail=f"{report.DETAIL_TYPE} for {report.job_id} attempt {report.attempt}: {proof.value}",
            )
        return self.reactions.report(report)

    def _proof(self, signed: SignedReport) -> Proof:
        report, now = signed.report, self.ports.clock.now()
        return verify_any(
            self.ports.report_keys.verifying_keys(job_id=report.job_id, attempt=report.attempt, now=now),
            report.DETAIL_TYPE,
            report.signed_fields(),
            signed_at=signed.signed_at,
            signature=signed.signature,
            now=now,
        )
