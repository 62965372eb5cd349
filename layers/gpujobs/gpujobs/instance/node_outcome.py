"""How a node's workload ended, in the terms the control plane acts on, and what the node keeps.

Split from `bootstrap` (which drives the node's life): the GPU check before the rendezvous, the
reading of the workload's exit (a failure while new hardware XIDs were logged is a hardware fault,
`gpu_health`; a workload that exits with one of the bootstrap's own hardware codes is reported as a
crash, so a script cannot pass its crash off as the host's), and, with `keep_on_failure`, keeping a
crashed container for inspection (`Runtime.keep_for_inspection`).
"""

from __future__ import annotations

from typing import Any

from gpujobs.instance.contract import EXIT_HARDWARE_FAULT, EXIT_PREEMPTED, EXIT_UNHEALTHY_NODE
from gpujobs.instance.errors import UnhealthyNodeError
from gpujobs.instance.gpu_health import Xid, check_node, hardware_fault
from gpujobs.instance.log import log
from gpujobs.instance.runtimes import Runtime


def check_gpus(doc: dict[str, Any], instance_type: str) -> bool:
    """This node's GPU check (`gpu_health.check_node`) against the type's GPUs; raises when it fails.
    Whether the host has GPUs to judge (nvidia-smi ran)."""
    expected = doc["gpu_counts"].get(instance_type, doc["gpus_per_node"]) if doc["gpus_per_node"] > 0 else 0
    health = check_node(expected_gpus=expected)
    for note in health.notes:
        log(f"GPU check: {note}")
    if not health.ok:
        raise UnhealthyNodeError(f"GPU check failed on {instance_type}: {health.summary()}")
    log(f"GPU check passed ({expected} GPU(s) expected)" if expected else "GPU check: nothing to check")
    return health.gpus_seen


def interconnect_floor(doc: dict[str, Any], instance_type: str, *, gpus_seen: bool) -> float | None:
    """The all-reduce floor (GB/s) this node's launcher judges its gang by: None for a single node (no
    check), 0 where there is nothing to judge (a type without one in the document, a host without GPUs:
    a CPU's gloo figure says nothing of the fabric), which measures and logs only."""
    if doc["nodes"] < 2:
        return None
    return float(doc["interconnect_floors"].get(instance_type, 0.0)) if gpus_seen else 0.0


def node_outcome(
    code: int, runtime: Runtime, *, signum: int, xids_before: list[Xid], doc: dict[str, Any]
) -> tuple[int, str, int]:
    """The node's exit code and message, and the seconds its host is kept up for (0: none)."""
    signalled = f" after signal {signum}" if signum else ""
    fault = _hardware_fault(code, xids_before, signum=signum, gpus=doc["gpus_per_node"])
    if fault is not None:
        code, message = EXIT_HARDWARE_FAULT, f"workload exited with {code}: {fault}"
    else:
        if code in (EXIT_UNHEALTHY_NODE, EXIT_HARDWARE_FAULT):
            log(f"the workload exited {code}, a code the bootstrap reserves for bad hardware: reported as 1")
            code = 1
        message = f"workload exited with {code}{signalled}" + (f": {runtime.last_line}" if code else "")
    return code, message, _keep_after_crash(runtime, doc, code=code, signalled=bool(signum))


def _keep_after_crash(runtime: Runtime, doc: dict[str, Any], *, code: int, signalled: bool) -> int:
    """With `keep_on_failure`, after a crash (not 0, not 75, no signal, not a hardware fault, whose host
    is replaced anyway): what the workload left is kept and the host stays up; the seconds it is kept
    for (0: it powers off at once, as after any exit)."""
    if not doc["keep_on_failure_seconds"] or code in (0, EXIT_PREEMPTED, EXIT_HARDWARE_FAULT) or signalled:
        return 0
    log(f"the workload crashed (exit {code}): keep_on_failure keeps this host up for inspection")
    return int(doc["keep_on_failure_seconds"]) if runtime.keep_for_inspection(doc) else 0


def _hardware_fault(code: int, before: list[Xid], *, signum: int, gpus: int) -> str | None:
    """For a workload that failed on its own (not 0, 75 or a signal): the new hardware XIDs, in words."""
    if code in (0, EXIT_PREEMPTED) or signum or gpus <= 0:
        return None
    return hardware_fault(before)
