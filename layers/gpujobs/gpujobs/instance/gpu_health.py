"""Is this node's hardware fit to train? The GPU check before the workload, the XID check after it.

A bad GPU host costs more than its own hour: a gang with one node whose GPU fell off the bus, whose
memory has a page retirement pending or whose driver sees fewer GPUs than the type has trains
slowly, hangs in a collective or dies with a CUDA error that looks like the job's crash. So before
the rendezvous, each node checks (`check_node`):

- `nvidia-smi --query-gpu=... --format=csv,noheader`: one line per GPU. Fewer lines than the type's
  GPUs (the run document's `gpu_counts`, from the packaged catalog), an uncorrected volatile ECC
  error or a page retirement pending fail the node. `[N/A]`/`[Not Supported]` (row-remapping GPUs
  have no page retirement) is no evidence either way. nvidia-smi failing on a GPU type fails it too.
- `dcgmi diag -r 1` where DCGM is installed: a `Fail` row fails the node, except Deployment rows
  that name the host's setup rather than its hardware (persistence mode, environment variables):
  those are logged. A DCGM that cannot run (no host engine) is logged, never a verdict.
- The kernel log (`dmesg`): XID errors of the hardware kind (`HARDWARE_XIDS`, from NVIDIA's Xid
  catalog: ECC, page retirement and row remapping, NVLink, fallen off the bus, GSP). The XIDs an
  application causes (13, 31, 43, 45) are the job's and are not held against the host.

A node that fails exits `EXIT_UNHEALTHY_NODE` with what it found; the control plane relaunches
without spending an attempt and scores the pool down (`domain.fate`). After a workload that failed,
new hardware XIDs since its start turn its exit into `EXIT_HARDWARE_FAULT` (`hardware_fault`).
On a host without nvidia-smi (CPU types, the local cloud) there are no GPUs to check: it passes.
Every command is an argv list run with a timeout; the parsers are pure (tests feed them the tools'
documented output). Python 3.9, stdlib only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable

GPU_QUERY_FIELDS = ("index", "pci.bus_id", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
"""`nvidia-smi --help-query-gpu` names; one CSV line per GPU, in this order."""
NVIDIA_SMI_ARGV = ("nvidia-smi", "--query-gpu=" + ",".join(GPU_QUERY_FIELDS), "--format=csv,noheader")
DCGMI_ARGV = ("dcgmi", "diag", "-r", "1")
DMESG_ARGV = ("dmesg",)
QUERY_TIMEOUT = 60.0
DCGMI_TIMEOUT = 300.0
"""`dcgmi diag -r 1` (the quick deployment checks) takes seconds; the bound is for a wedged driver."""
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
"""XIDs of the GPU's hardware in NVIDIA's Xid catalog: 48 double-bit ECC, 61/62 internal
micro-controller, 63/64 page retirement or row remapping, 74 NVLink, 79 fallen off the bus, 92 high
single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP, 140 unrecovered ECC."""
SETUP_ONLY_ROWS = frozenset({"persistence mode", "environment variables", "permissions and os blocks"})
"""Deployment rows of `dcgmi diag` that fail for the host's setup, not its hardware: logged only."""
_NA = re.compile(r"^\[(N/A|Not Supported|Unknown Error)\]$", re.IGNORECASE)
_XID = re.compile(r"NVRM: Xid \((?P<device>[^)]*)\): (?P<xid>\d+)(?:, (?P<rest>.*))?")
_DIAG_ROW = re.compile(r"^\|\s*(?P<name>[^|]*?)\s*\|\s*(?P<result>[^|]*?)\s*\|$")
_DIAG_SECTION = re.compile(r"^[+|]-+\s+(?P<name>[A-Za-z ]+?)\s+-+")

Run = Callable[[list[str], float], "tuple[int, str] | None"]
"""Runs argv with a timeout: (exit code, stdout and stderr), or None when the tool is not installed."""


@dataclass(frozen=True)
class Xid:
    device: str
    code: int
    line: str


@dataclass
class Health:
    """What the checks found: `problems` make the node unfit, `notes` are only logged."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gpus_seen: bool = False
    """nvidia-smi ran: this host has GPUs (a CPU type or the local cloud has none to judge)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return "; ".join(self.problems) if self.problems else "; ".join(self.notes) or "healthy"


def gpu_query_problems(text: str, *, expected: int) -> list[str]:
    """What `NVIDIA_SMI_ARGV`'s output says is wrong: too few GPUs, ECC errors, pending retirements."""
    rows = [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]
    problems = []
    if len(rows) < expected:
        problems.append(f"nvidia-smi sees {len(rows)} GPU(s), the type has {expected}")
    for row in rows:
        if len(row) != len(GPU_QUERY_FIELDS):
            problems.append(f"nvidia-smi printed an unexpected line: {', '.join(row)}")
            continue
        index, bus, ecc, pending = row
        if not _NA.match(ecc) and ecc.isdigit() and int(ecc) > 0:
            problems.append(f"GPU {index} ({bus}): {ecc} uncorrected ECC error(s) since the driver loaded")
        if pending.lower() == "yes":
            problems.append(f"GPU {index} ({bus}): a page retirement is pending (reboot and reset needed)")
    return problems


def dcgmi_diag_results(text: str) -> list[tuple[str, str, str]]:
    """(section, test, result) for each result row of `dcgmi diag`'s table; continuation and
    message rows (`Warning`, `Error`, blank names) are left out."""
    results = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        heading = _DIAG_SECTION.match(line)
        if heading:
            section = heading.group("name").strip()
            continue
        row = _DIAG_ROW.match(line)
        if not row or not section:
            continue
        name, result = row.group("name"), row.group("result")
        if (
            name
            and name not in ("Warning", "Error", "Info")
            and result.split(" ")[0] in ("Pass", "Fail", "Skip", "Warn")
        ):
            results.append((section, name, result))
    return results


def dcgmi_problems(text: str) -> tuple[list[str], list[str]]:
    """(problems, notes) of a `dcgmi diag` run: hardware failures, and setup failures only logged."""
    problems: list[str] = []
    notes: list[str] = []
    for section, name, result in dcgmi_diag_results(text):
        if not result.startswith("Fail"):
            continue
        said = f"dcgmi diag {section}/{name}: {result}"
        (notes if section == "Deployment" and name.lower() in SETUP_ONLY_ROWS else problems).append(said)
    return problems, notes


def hardware_xids(kernel_log: str) -> list[Xid]:
    """The hardware XIDs (`HARDWARE_XIDS`) in kernel log text, oldest first."""
    found = []
    for line in kernel_log.splitlines():
        match = _XID.search(line)
        if match and int(match.group("xid")) in HARDWARE_XIDS:
            found.append(Xid(match.group("device"), int(match.group("xid")), line.strip()))
    return found


def run_tool(argv: list[str], timeout: float) -> tuple[int, str] | None:
    """`Run` for real: argv, never a shell; None when the tool is not on PATH; a timeout is exit 124."""
    path = shutil.which(argv[0])
    if path is None:
        return None
    try:
        done = subprocess.run(
            [path, *argv[1:]], capture_output=True, text=True, timeout=timeout, check=False, errors="replace"
        )
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not answer within {timeout:.0f}s"
    except OSError as exc:
        return 126, f"{argv[0]} could not run: {exc}"
    return done.returncode, done.stdout + done.stderr


def kernel_log_xids(run: Run = run_tool) -> list[Xid]:
    """The hardware XIDs the kernel log holds now ([] when it cannot be read)."""
    out = run(list(DMESG_ARGV), QUERY_TIMEOUT)
    return hardware_xids(out[1]) if out is not None and out[0] == 0 else []


def check_node(*, expected_gpus: int, run: Run = run_tool) -> Health:
    """The node's GPU check (see the module). `expected_gpus`: the type's GPUs; 0 checks nothing."""
    health = Health()
    if expected_gpus <= 0:
        health.notes.append("no GPUs to check (a CPU type)")
        return health
    query = run(list(NVIDIA_SMI_ARGV), QUERY_TIMEOUT)
    if query is None:
        health.notes.append("no GPUs to check (no nvidia-smi on this host)")
        return health
    code, out = query
    health.gpus_seen = True
    if code != 0:
        health.problems.append(f"nvidia-smi failed (exit {code}): {_last_line(out)}")
    else:
        health.problems.extend(gpu_query_problems(out, expected=expected_gpus))
    diag = run(list(DCGMI_ARGV), DCGMI_TIMEOUT)
    if diag is None:
        health.notes.append("no dcgmi on this host: DCGM diagnostics skipped")
    else:
        problems, notes = dcgmi_problems(diag[1])
        health.problems.extend(problems)
        health.notes.extend(notes)
        if diag[0] != 0 and not dcgmi_diag_results(diag[1]):
            health.notes.append(f"dcgmi diag could not run (exit {diag[0]}): {_last_line(diag[1])}")
    xids = kernel_log_xids(run)
    health.problems.extend(f"XID {x.code} on {x.device}" for x in xids[-3:])
    return health


def hardware_fault(before: list[Xid], run: Run = run_tool) -> str | None:
    """After a failed workload: the hardware XIDs logged since `before` was read, in words (None: none)."""
    seen = {x.line for x in before}  # dmesg's lines carry their time: a line seen before is an old XID
    new = [x for x in kernel_log_xids(run) if x.line not in seen]
    if not new:
        return None
    return "hardware fault: " + "; ".join(f"XID {x.code} on {x.device}" for x in new[-3:])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"
