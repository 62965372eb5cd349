"""`gpujobs local demo` (what `make demo` runs): a job survives a spot interruption, end to end.

With `--nodes 2` the reclaimed node is one of a gang: only it is replaced, into the gang's pool and
attempt, and the survivor regroups with its replacement (`domain.regroup`).

Everything real runs: the stack built from template.yaml on a moto server on 127.0.0.1, the Lambda
handlers fed by the template's own event sources, the instance bootstrap from user data with its own
fake IMDSv2 per instance, the trainer under torchrun (2 processes per node, gloo on CPU)
checkpointing to S3 on that server. The demo only plays the user: in the middle of training it runs
`gpujobs interrupt JOB --node K`, the drill any user of `gpujobs local up` runs, whose FIS experiment
the local cloud plays on the spot instance (the IMDS notice plus the EventBridge warning, then the
termination after a notice scaled down for the demo), and watches the story unfold.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpujobs.contract import CHECKPOINT_COMMITTED, job_log_stream, outputs_prefix
from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from gpujobs.service.ports import JobNotFoundError
from gpujobs_cli.artifacts import list_artifacts
from gpujobs_local.cloud import Delivery
from gpujobs_local.session import LocalSession, add_instance_python_option, local_session
from gpujobs_local.stack import ROOT
from gpujobs_local.story import MetricLineFilter, Story, story_parser

TRAIN = ROOT / "training_image" / "examples" / "digits" / "train.py"
STEPS = 400
CHECKPOINT_EVERY_STEPS = 100
INTERRUPT_AFTER_STEP = 160
"""Well after a periodic save: a warning within `coalescing.COALESCE_SECONDS` of a save's start joins
that save rather than saving (and the steps since it are trained again); this one saves at once."""
NOTICE_SECONDS = 8.0
_PROGRESS = re.compile(r"\[digits\] step\s+(\d+)/")


def demo_spec(*, nodes: int) -> dict[str, Any]:
    return {
        "name": "digits-demo",
        "image": "local/gpujobs-train:dev",
        "command": [
            "python",
            str(TRAIN),
            "--steps",
            str(STEPS),
            "--log-every",
            "10",
            "--step-sleep",
            "0.03",
            "--checkpoint-every-steps",
            str(CHECKPOINT_EVERY_STEPS),
            "--export",
        ],
        "nodes": nodes,
        "gpus_per_node": 2,
        "instance_types": ["g5.12xlarge", "g6.12xlarge"],
        "capacity": "spot-first",
        "client_token": f"demo-{int(time.time() * 1000)}",
        "team": "demo",
    }


@dataclass
class Demo:
    """One run of the demo: submit, interrupt the spot instance mid-training, watch the job resume."""

    session: LocalSession
    story: Story
    nodes: int
    job_id: str = ""
    checkpoints: list[tuple[int, int, str]] = field(default_factory=list)
    """(step, attempt, reason) of every checkpoint committed, as the control plane heard of them."""

    # ---- watching ---------------------------------------------------------------------------
    def on_delivery(self, delivery: Delivery) -> None:
        event = delivery.event or {}
        if delivery.kind == CHECKPOINT_COMMITTED:
            detail = event.get("detail", {})
            seen = (int(detail.get("step", -1)), int(detail.get("attempt", 0)), str(detail.get("reason", "")))
            if seen not in self.checkpoints:
                self.checkpoints.append(seen)
                step = seen[0]
                self.story.step(
                    f"checkpoint committed at step {step} (attempt {detail.get('attempt')}, {detail.get('reason')})"
                )
        elif delivery.error is not None:
            self.story.step(f"{delivery.function} failed on {delivery.kind}: {delivery.error}")

    def job(self) -> Job:
        return self.session.job(self.job_id)

    def state(self) -> JobState | None:
        try:
            return self.job().state
        except JobNotFoundError:
            return None

    def wait(self, what: str, predicate: Any, timeout: float = 90.0) -> None:
        try:
            self.session.cloud.wait_until(predicate, timeout=timeout, what=what)
        except TimeoutError as timed_out:
            raise TimeoutError(f"{timed_out}\n{self.instance_log_tails()}") from None

    def instance_log_tails(self, lines: int = 40) -> str:
        """The end of every instance log of the job, so a story that timed out says why."""
        tails = []
        for attempt in self.job().attempts:
            for instance_id in attempt.instance_ids:
                log = self.session.runner.log_path(instance_id)
                text = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else ["(no log)"]
                tails.append(f"--- attempt {attempt.number}, {instance_id} ---\n" + "\n".join(text))
        return "\n".join(tails) or "(no instance was launched)"

    def progress(self, attempt: int) -> int:
        """The newest step the attempt's rank-0 node has printed."""
        job = self.job()
        record = job.attempt(attempt)
        if record is None or not record.instance_ids:
            return -1
        log = self.session.runner.log_path(record.instance_ids[0])
        steps = [int(m.group(1)) for m in _PROGRESS.finditer(log.read_text(errors="replace"))] if log.exists() else []
        return max(steps, default=-1)

    def result_line(self, attempt: int, event: str, *, after_step: int = -1) -> dict[str, Any] | None:
        """The trainer's `event` line that the attempt's global rank 0 printed with a step past
        `after_step` (a regrouped gang's rank 0 may be any of its nodes, and prints it again)."""
        record = self.job().attempt(attempt)
        if record is None or not record.instance_ids:
            return None
        for instance_id in record.instance_ids:
            log = self.session.runner.log_path(instance_id)
            text = log.read_text(errors="replace") if log.exists() else ""
            for line in text.splitlines():
                if line.startswith("{") and f'"event": "{event}"' in line:
                    found: dict[str, Any] = json.loads(line)
                    if int(found.get("step", 0)) > after_step:
                        return found
        return None

    # ---- the story --------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cloud = self.session.cloud
        cloud.on_delivery(self.on_delivery)
        spec = demo_spec(nodes=self.nodes)
        self.session.send(spec)
        from gpujobs.domain.job_ids import job_id_for

        self.job_id = job_id_for(client_token=spec["client_token"], team=spec["team"], message_id=None)
        self.story.step(
            f"submitted {spec['name']} as {self.job_id}: {self.nodes} node(s) x 2 processes, {STEPS} steps on digits"
        )
        self.wait("the job to run", lambda: self.state() is JobState.RUNNING)
        first = self.job().current_attempt
        assert first is not None
        self.story.step(
            f"launched attempt 1: {len(first.instance_ids)} x {first.instance_type} in {first.zone}"
            f" ({first.market.value if first.market else '?'}) {', '.join(first.instance_ids)}"
        )
        self.wait(f"training past step {INTERRUPT_AFTER_STEP}", lambda: self.progress(1) >= INTERRUPT_AFTER_STEP, 120)
        node = len(first.instance_ids) - 1
        victim = first.instance_ids[node]
        warned_at = time.monotonic()
        drill = json.loads(self.session.gpujobs("interrupt", self.job_id, "--node", str(node), "--json"))
        self.story.step(
            f"$ gpujobs interrupt {self.job_id} --node {node}: FIS experiment {drill['experiment_id']} interrupts"
            f" {drill['instance_id']} at step ~{self.progress(1)} (the local cloud reclaims it {NOTICE_SECONDS:g} s"
            " after the warning)"
        )
        self.wait("the replacement", lambda: self._replaced(first.number))
        replacement = self.job().current_attempt
        assert replacement is not None
        if replacement.number == first.number:
            return self.regrouped(victim, warned_at)
        self.story.step(
            f"replacement attempt {replacement.number} launched at once: {len(replacement.instance_ids)} x"
            f" {replacement.instance_type} in {replacement.zone}"
            f" ({replacement.market.value if replacement.market else '?'})"
        )
        self.wait("the replacement to resume", lambda: self.result_line(replacement.number, "resumed") is not None, 150)
        resumed = self.result_line(replacement.number, "resumed") or {}
        resumed_at = time.monotonic()
        # how far attempt 1 trained (its last progress line or checkpoint) and the newest step it
        # committed: the replacement resumes from that one, and trains the steps in between again
        handed_over = max([step for step, attempt, _ in self.checkpoints if attempt == 1], default=0)
        stopped_at = max(self.progress(1), handed_over)
        self.story.step(f"attempt {replacement.number} resumed from step {resumed.get('step')}")
        self.wait("the job to finish", lambda: self.job().state.is_terminal, 150)
        final = self.job()
        result = self.result_line(replacement.number, "final") or {}
        self.story.step(f"job {final.state.value}: held-out accuracy {result.get('accuracy')}")
        summary = self.summary(final, resumed, result, (handed_over, stopped_at), resumed_at - warned_at)
        outputs = summary["outputs"]
        self.story.step(f"outputs: {', '.join(outputs['keys']) or 'none'} in {outputs['uri']} (gpujobs artifacts)")
        return summary

    def _replaced(self, number: int) -> bool:
        """A later attempt, or the same attempt regrouped around a replacement of the reclaimed node."""
        current = self.job().current_attempt
        return current is not None and (current.number > number or current.generation > 0)

    def regrouped(self, victim: str, warned_at: float) -> dict[str, Any]:
        """The rest of a two-node story: the gang regroups around the reclaimed node's replacement."""
        attempt = self.job().current_attempt
        assert attempt is not None
        assert attempt.regroup is not None
        (replacement,) = attempt.regroup.replacements
        survivors = [i for i in attempt.instance_ids if i != replacement]
        self.story.step(
            f"only {victim} is replaced: {replacement} launched into the gang's pool ({attempt.instance_type} in"
            f" {attempt.zone}, {attempt.market.value if attempt.market else '?'}), attempt {attempt.number} goes on;"
            f" {', '.join(survivors)} stays up and regroups with it (generation {attempt.generation})"
        )
        stopped_at = self.progress(attempt.number)
        self.wait("the gang to resume", lambda: self.result_line(attempt.number, "resumed", after_step=0) is not None)
        resumed = self.result_line(attempt.number, "resumed", after_step=0) or {}
        resumed_at = time.monotonic()
        self.story.step(f"the regrouped gang resumed from step {resumed.get('step')}")
        self.wait("the job to finish", lambda: self.job().state.is_terminal, 150)
        final = self.job()
        result = self.result_line(attempt.number, "final") or {}
        self.story.step(f"job {final.state.value}: held-out accuracy {result.get('accuracy')}")
        handed_over = max([step for step, number, _ in self.checkpoints if number == attempt.number], default=0)
        summary = self.summary(final, resumed, result, (handed_over, stopped_at), resumed_at - warned_at)
        done = final.current_attempt
        assert done is not None
        summary["regroup"] = {
            "lost": [victim],
            "replacement": replacement,
            "survivors": survivors,
            "generation": done.generation,
            "resumed_step": resumed.get("step"),
            "trained_to_step": stopped_at,
        }
        summary["steps_lost"] = max(0, stopped_at - int(resumed.get("step", 0)))
        return summary

    def summary(
        self,
        job: Job,
        resumed: dict[str, Any],
        result: dict[str, Any],
        first_ended: tuple[int, int],
        warning_to_resumed: float,
    ) -> dict[str, Any]:
        """`first_ended`: attempt 1's newest committed step and the step it had trained to."""
        handed_over, stopped_at = first_ended
        attempts = []
        for attempt in job.attempts:
            if not attempt.instance_ids:
                continue
            first = attempt.number == 1 and not attempt.generation  # a regrouped attempt 1 trained to the end
            start = attempt.resume_from_step if attempt.number == 1 else resumed.get("step")
            end = handed_over if first else result.get("step")
            attempts.append(
                {
                    "attempt": attempt.number,
                    "instance_type": attempt.instance_type,
                    "zone": attempt.zone,
                    "market": attempt.market.value if attempt.market else None,
                    "instances": list(attempt.instance_ids),
                    "start_step": start or 0,
                    "end_step": end,
                    "trained_to_step": stopped_at if first else result.get("step"),
                    "end_reason": attempt.end_reason,
                    "generation": attempt.generation,
                    "left": list(attempt.left),
                }
            )
        resumed_step = resumed.get("step")
        return {
            "job_id": job.job_id,
            "final_state": job.state.value,
            "attempts": attempts,
            "checkpoint_steps": sorted({step for step, _, _ in self.checkpoints}),
            "checkpoints": [
                {"step": step, "attempt": attempt, "reason": why} for step, attempt, why in self.checkpoints
            ],
            "steps_lost": (stopped_at - resumed_step) if isinstance(resumed_step, int) else None,
            "seconds_warning_to_resumed": round(warning_to_resumed, 1),
            "accuracy": result.get("accuracy"),
            "total_seconds": round(self.story.elapsed(), 1),
            "logs": {  # what `gpujobs logs JOB [--attempt N] [--node K]` reads, while the cloud runs
                "log_group": self.session.cloud.outputs["JobLogGroupName"],
                "streams": [
                    job_log_stream(job.job_id, attempt.number, node, team=job.team, generation=generation)
                    for attempt in job.attempts
                    for generation in sorted({0, attempt.generation})
                    for node in range(len(attempt.instance_ids))
                ],
            },
            "outputs": self.outputs(),
        }

    def outputs(self) -> dict[str, Any]:
        """Where the job's output folder went, and what is there (`gpujobs artifacts` reads the same)."""
        bucket = self.session.cloud.outputs["CheckpointBucketName"]
        prefix = outputs_prefix(self.job_id, team=self.job().team)
        found = list_artifacts(self.session.cloud.client("s3"), bucket=bucket, prefix=prefix)
        return {"uri": f"s3://{bucket}/{prefix}", "keys": [a.key for a in found]}


def main(argv: list[str] | None = None) -> int:
    parser = story_parser(prog="gpujobs local demo", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 2), help="instances in the gang (default 1)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs here (default: a temporary folder)")
    add_instance_python_option(parser)
    args = parser.parse_args(argv)
    out = sys.stdout
    sys.stdout = MetricLineFilter(out)  # Powertools prints its cold-start metric line even when disabled
    try:
        return _run(args, out)
    finally:
        sys.stdout = out


def _run(args: argparse.Namespace, out: TextIO) -> int:
    story = Story(out=None if args.json else out)
    with tempfile.TemporaryDirectory(prefix="gpujobs-demo-") as tmp:
        workdir = args.workdir or Path(tmp)
        story.step(f"starting the local cloud (logs in {workdir})")
        with local_session(
            workdir=workdir, instance_python=args.instance_python, spot_notice_seconds=NOTICE_SECONDS
        ) as session:
            summary = Demo(session=session, story=story, nodes=args.nodes).run()
    if args.json:
        print(json.dumps(summary, indent=2), file=out)
    else:
        story.step(
            f"summary: {summary['final_state']}, accuracy {summary['accuracy']}, steps lost {summary['steps_lost']},"
            f" {summary['seconds_warning_to_resumed']} s from warning to resumed, {summary['total_seconds']} s in all"
        )
    return 0 if summary["final_state"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
