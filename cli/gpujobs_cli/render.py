"""Text views of jobs for people: the `status` page and the `list` table.

Pure functions from Job to str, so that they are tested without AWS and the commands only decide
what to fetch and where to print. Times are shown in UTC; `--json` is the exact, machine form.

Job data comes from whoever submitted the job (names, problems, details echo their input), so every
piece of it goes through `printable` on its way to the terminal: an ESC or any other control
character is shown as `\\xNN`, never sent, and cannot recolour, retitle or rewrite a user's terminal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from gpujobs.domain.deadline import Slack, slack_of
from gpujobs.domain.job import Job
from gpujobs.domain.spec_errors import printable
from gpujobs.domain.spec_parts import CheckpointMode
from gpujobs_cli.spend import Spend, dollars

DETAIL_WIDTH = 48


def when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines)


def truncate(text: str, width: int = DETAIL_WIDTH) -> str:
    text = printable(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 3] + "..."


def _opt(value: object) -> str:
    return "-" if value is None or value == "" else printable(str(value))


def standing(job: Job, now: datetime) -> Slack | None:
    """The job's slack to its deadline, from its newest heartbeat while it trains; None without one."""
    if job.spec is None:
        return None
    attempt = job.current_attempt
    return slack_of(job, now=now, step=attempt.heartbeat_step if attempt and not attempt.is_over else None)


def _hours(span: timedelta) -> float:
    return round(span.total_seconds() / 3600, 1)


def deadline_json(job: Job, now: datetime) -> dict[str, object] | None:
    """`status --json`'s `deadline`: when it is due and, while the job is active, hours left and slack."""
    slack = standing(job, now)
    if slack is None:
        return None
    active = not job.state.is_terminal
    return {
        "due": slack.deadline_at.isoformat(),
        "hours_left": _hours(slack.time_left) if active else None,
        "slack_hours": _hours(slack.slack) if active else None,
    }


def deadline_line(job: Job, now: datetime) -> str | None:
    slack = standing(job, now)
    if slack is None:
        return None
    due = f"(due {when(slack.deadline_at)})"
    if job.state.is_terminal:
        return f"deadline  {due}"
    left = _hours(slack.time_left)
    timing = f"in {left} h" if left >= 0 else f"passed {-left} h ago"
    return f"deadline  {timing}, slack {_hours(slack.slack)} h {due}"


def checkpoint_line(job: Job) -> str | None:
    """Where the job's work is kept. A `checkpoint: directory` job's "step" is the number of its
    folder's newest complete sync (the script's own files; `gpujobs_trainer.script_checkpoints`), so it
    is shown as that sync and its time, not as a training step; nothing resumes an ended job."""
    step = job.checkpoint_step
    if step is None:
        return None
    if job.spec is not None and job.spec.checkpoint is CheckpointMode.DIRECTORY:
        at = max((a.checkpoint_at for a in job.attempts if a.checkpoint_step == step and a.checkpoint_at), default=None)
        synced = f"the script's folder, sync #{step}" + (f" at {when(at)}" if at is not None else "")
        return f"checkpoint {synced}" + ("" if job.state.is_terminal else " (the next attempt restores it)")
    if job.state.is_terminal:
        return f"checkpoint newest committed at step {step}"
    return f"resumes   from checkpoint step {step}"


def job_status(job: Job, *, spend: Spend | None = None, now: datetime | None = None) -> str:
    """The `gpujobs status` page; with `spend`, its cost (and, once ended, its GPU-hours); `now`: the time
    the deadline's slack is read at, default the clock."""
    lines = [
        f"job       {job.job_id}",
        f"name      {_opt(job.name)}",
        f"team      {_opt(job.team)}",
        f"state     {job.state.value}",
        f"detail    {_opt(job.status_detail)}",
        f"created   {when(job.created_at)}",
        f"updated   {when(job.updated_at)}",
    ]
    if job.spec is not None:
        spec = job.spec
        lines.append(
            f"spec      {spec.nodes} x {spec.gpus_per_node} GPU on {', '.join(spec.instance_types)}"
            f" ({spec.capacity.value})"
        )
    deadline = deadline_line(job, now or datetime.now(UTC))
    if deadline is not None:
        lines.append(deadline)
    if spend is not None:
        lines += spend_lines(spend, ended=job.state.is_terminal)
    checkpoint = checkpoint_line(job)
    if checkpoint is not None:
        lines.append(checkpoint)
    if job.interruptions or job.crashes:
        lines.append(f"counts    {job.interruptions} interruption(s), {job.crashes} crash(es)")
    if job.next_try_at is not None:
        lines.append(f"next try  {when(job.next_try_at)}")
    if job.hold_reason:
        lines.append(f"held      {printable(job.hold_reason)}")
    kept = kept_line(job, now or datetime.now(UTC))
    if kept is not None:
        lines.append(kept)
    if job.stop_request is not None:
        stop = job.stop_request
        progress = (
            f"executed {when(stop.executed_at)}"
            if stop.executed_at
            else f"waiting for a checkpoint until {when(stop.deadline)}"
        )
        lines.append(f"stopping  {stop.reason.value}: {_opt(stop.detail)} ({progress})")
    lines += progress_lines(job)
    if job.problems:
        lines += ["", "problems:", *(f"  {printable(p)}" for p in job.problems)]
    if job.attempts:
        rows = [
            [
                str(a.number),
                _opt(a.instance_type),
                _opt(a.zone),
                _opt(a.market.value if a.market else None),
                ",".join(a.instance_ids) or "-",
                when(a.started_at),
                when(a.ended_at),
                _opt(a.end_reason),
                _opt(a.checkpoint_step),
            ]
            for a in job.attempts
        ]
        headers = ["#", "TYPE", "ZONE", "MARKET", "INSTANCES", "STARTED", "ENDED", "END REASON", "CKPT STEP"]
        lines += ["", "attempts:", _indent(table(headers, rows))]
    lines += error_lines(job)
    tries = [(a.number, t) for a in job.attempts for t in a.tries]
    if tries:
        rows = [
            [
                str(n),
                when(t.at),
                _opt(t.instance_type),
                _opt(t.zone),
                t.market.value,
                _opt(t.error_code),
                truncate(t.message, 60),
            ]
            for n, t in tries
        ]
        headers = ["#", "AT", "TYPE", "ZONE", "MARKET", "ERROR", "MESSAGE"]
        lines += ["", "failed launch tries:", _indent(table(headers, rows))]
    if job.history:
        rows = [
            [
                when(h.at),
                h.source.value if h.source else "(new)",
                h.target.value,
                h.reason.value,
                _opt(h.attempt),
                truncate(h.detail, 60) or "-",
            ]
            for h in job.history
        ]
        headers = ["AT", "FROM", "TO", "REASON", "ATTEMPT", "DETAIL"]
        lines += ["", "history:", _indent(table(headers, rows))]
    return "\n".join(lines)


def kept_line(job: Job, now: datetime) -> str | None:
    """A FAILED job's gang kept up for inspection (`keep_on_failure`): until when, and that it is billed."""
    kept = job.kept
    if kept is None:
        return None
    if kept.lasts(now):
        return f"kept      for inspection until {kept.until:%H:%M} UTC, billed (gpujobs shell/exec; cancel releases it)"
    how = "released by a cancel" if kept.released_at is not None and kept.released_at < kept.until else "over"
    return f"kept      for inspection until {when(kept.ends_at)}: {how}"


def progress_lines(job: Job) -> list[str]:
    """While an attempt trains: its newest step and, from its newest heartbeat that carried them,
    the metrics the script logged and the throughput."""
    current = job.current_attempt
    if current is None or current.last_heartbeat_at is None:
        return []
    lines = [f"progress  step {current.heartbeat_step} at {when(current.last_heartbeat_at)}"]
    point = job.progress.latest
    if point is None or point.attempt != current.number:
        return lines
    if point.metrics:
        values = "  ".join(f"{printable(name)} {value:.6g}" for name, value in point.metrics.items())
        lines.append(f"metrics   {values}  (step {point.step})")
    if point.steps_per_second is not None:
        samples = f", {point.samples_per_second:.6g} samples/s" if point.samples_per_second is not None else ""
        lines.append(f"speed     {point.steps_per_second:.3g} steps/s{samples}")
    return lines


def metric_series(job: Job) -> str:
    """`gpujobs metrics`: one row per recorded point, a column per metric name, oldest first."""
    points = job.progress.points
    if not points:
        return (
            f"{job.job_id}: no metrics recorded (the script reports them with run.log(...) or step_done(metrics=...))"
        )
    names = list(dict.fromkeys(name for p in points for name in p.metrics))
    rows = [
        [
            when(p.at),
            str(p.attempt),
            str(p.step),
            *(f"{p.metrics[n]:.6g}" if n in p.metrics else "-" for n in names),
            _opt(None if p.steps_per_second is None else f"{p.steps_per_second:.3g}"),
            _opt(None if p.samples_per_second is None else f"{p.samples_per_second:.6g}"),
        ]
        for p in points
    ]
    text = table(["TIME", "ATTEMPT", "STEP", *(printable(n).upper() for n in names), "STEPS/S", "SAMPLES/S"], rows)
    if job.progress.dropped:
        text += f"\n({job.progress.dropped} older points not kept: the record keeps the newest {len(points)})"
    return text


def error_lines(job: Job) -> list[str]:
    """The exit message of each failed attempt (say, a configuration error's), one line each."""
    failed = [a for a in job.attempts if a.error_line]
    if not failed:
        return []
    return ["", "exit messages:", *(f"  #{a.number}  {truncate(a.error_line, 200)}" for a in failed)]


def spend_lines(spend: Spend, *, ended: bool) -> list[str]:
    """`cost` (so far, while the job runs) and, for an ended job, paid vs useful GPU-hours."""
    note = " (~: an upper estimate, spot priced at the on-demand list price)" if spend.estimated else ""
    lines = [f"cost      {dollars(spend)}{'' if ended else ' so far'}{note}"]
    if spend.paid_gpu_hours is not None and spend.useful_gpu_hours is not None:
        share = f" ({spend.useful_gpu_hours / spend.paid_gpu_hours:.0%})" if spend.paid_gpu_hours else ""
        lines.append(f"gpu-hours {spend.paid_gpu_hours:.2f} paid, {spend.useful_gpu_hours:.2f} useful{share}")
    return lines


def job_list(jobs: Sequence[Job], *, spends: Mapping[str, Spend] | None = None) -> str:
    """The `gpujobs list` table; with `spends` (by job id), a COST column."""
    headers = ["JOB ID", "NAME", "TEAM", "STATE", "ATTEMPT", "UPDATED", "DETAIL"]
    rows = [
        [
            printable(j.job_id),
            _opt(j.name),
            _opt(j.team),
            j.state.value,
            str(j.attempt_count) if j.attempt_count else "-",
            when(j.updated_at),
            truncate(j.status_detail) or "-",
        ]
        for j in jobs
    ]
    if spends is not None:
        headers.insert(5, "COST")
        for job, row in zip(jobs, rows, strict=True):
            spend = spends.get(job.job_id)
            row.insert(5, dollars(spend) if spend is not None else "-")
    return table(headers, rows)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
