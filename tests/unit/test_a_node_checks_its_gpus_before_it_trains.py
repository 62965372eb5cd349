"""A node checks its GPUs before it trains (`gpujobs.instance.gpu_health`), and says what it found.

The fixtures are the tools' documented output formats:
- `nvidia-smi --query-gpu=... --format=csv,noheader`: one comma-separated line per GPU, fields in
  the order asked; `retired_pages.pending` is "Yes"/"No", and "[N/A]" where a GPU remaps rows
  instead (nvidia-smi(1), "retired_pages.pending": https://manpages.ubuntu.com/manpages/plucky/man1/nvidia-smi.1.html;
  https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html).
- `dcgmi diag -r 1`: the result table of DCGM Diagnostics, sections Deployment / Integration /
  Hardware, each row `| Test | Pass|Fail|Skip[ - All] |`, a failure followed by `| Warning |` rows
  (https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html).
- The kernel log: `NVRM: Xid (PCI:<bus>): <code>, pid=..., ...` (NVIDIA's Xid catalog,
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpujobs.instance.gpu_health import (
    DCGMI_ARGV,
    DMESG_ARGV,
    NVIDIA_SMI_ARGV,
    Xid,
    check_node,
    hardware_fault,
    hardware_xids,
    run_tool,
)

EIGHT_HEALTHY = "".join(f"{i}, 00000000:{0x10 + i:02X}:1C.0, 0, [N/A]\n" for i in range(8))
DCGMI_PASS = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.3.5                                          |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| CUDA Main Library         | Pass                                           |
| Permissions and OS Blocks | Pass                                           |
| Persistence Mode          | Pass                                           |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | Pass                                           |
| Graphics Processes        | Pass                                           |
| Inforom                   | Pass                                           |
+-----  Integration  -------+------------------------------------------------+
| PCIe                      | Pass - All                                     |
+-----  Hardware  ----------+------------------------------------------------+
| GPU Memory                | Pass - All                                     |
+---------------------------+------------------------------------------------+
"""
DCGMI_PCIE_FAILS = DCGMI_PASS.replace(
    "| PCIe                      | Pass - All                                     |",
    "| PCIe                      | Fail - All                                     |\n"
    "| Warning                   | GPU 0 Error using CUDA API cudaDeviceGetByPCI  |\n"
    "|                           | BusId Check DCGM and system logs for errors.   |",
)
DCGMI_PERSISTENCE_OFF = DCGMI_PASS.replace(
    "| Persistence Mode          | Pass                                           |",
    "| Persistence Mode          | Fail                                           |\n"
    "| Error                     | Persistence mode for GPU 0 is currently disab  |",
)
XID_79 = "[ 8210.339146] NVRM: Xid (PCI:0000:00:1e): 79, pid=1234, GPU has fallen off the bus.\n"
XID_13 = "[  912.100000] NVRM: Xid (PCI:0000:00:1e): 13, pid=4321, Graphics Exception: ESR 0x404490=0x80000001\n"


class FakeTools:
    """A `Run` answering as these tools would (None: the tool is not installed); it records every argv."""

    def __init__(
        self, *, smi: str | None = EIGHT_HEALTHY, smi_code: int = 0, dcgmi: str | None = DCGMI_PASS, dmesg: str = ""
    ) -> None:
        self.calls: list[list[str]] = []
        self.answers = {
            NVIDIA_SMI_ARGV[0]: None if smi is None else (smi_code, smi),
            DCGMI_ARGV[0]: None if dcgmi is None else (0, dcgmi),
            DMESG_ARGV[0]: (0, dmesg),
        }

    def __call__(self, argv: list[str], timeout: float) -> tuple[int, str] | None:
        assert timeout > 0
        self.calls.append(argv)
        return self.answers[argv[0]]


def test_a_healthy_p4d_node_passes_and_each_tool_is_run_as_an_argv_list() -> None:
    run = FakeTools()
    health = check_node(expected_gpus=8, run=run)

    assert health.ok, health.problems
    assert health.gpus_seen  # so its gang's all-reduce is judged against the type's floor
    assert run.calls == [list(NVIDIA_SMI_ARGV), list(DCGMI_ARGV), list(DMESG_ARGV)]
    assert (
        NVIDIA_SMI_ARGV[1] == "--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending"
    )


def test_a_node_that_sees_fewer_gpus_than_its_type_has_is_unhealthy() -> None:
    seven = "".join(EIGHT_HEALTHY.splitlines(keepends=True)[:7])
    health = check_node(expected_gpus=8, run=FakeTools(smi=seven))

    assert not health.ok
    assert health.summary() == "nvidia-smi sees 7 GPU(s), the type has 8"


def test_an_uncorrected_ecc_error_or_a_pending_page_retirement_makes_a_node_unhealthy() -> None:
    lines = EIGHT_HEALTHY.splitlines(keepends=True)
    lines[2] = "2, 00000000:12:1C.0, 3, No\n"
    lines[5] = "5, 00000000:15:1C.0, 0, Yes\n"
    health = check_node(expected_gpus=8, run=FakeTools(smi="".join(lines)))

    assert health.problems == [
        "GPU 2 (00000000:12:1C.0): 3 uncorrected ECC error(s) since the driver loaded",
        "GPU 5 (00000000:15:1C.0): a page retirement is pending (reboot and reset needed)",
    ]


def test_a_failed_dcgm_hardware_test_fails_the_node_but_a_setup_row_is_only_logged() -> None:
    pcie = check_node(expected_gpus=8, run=FakeTools(dcgmi=DCGMI_PCIE_FAILS))
    persistence = check_node(expected_gpus=8, run=FakeTools(dcgmi=DCGMI_PERSISTENCE_OFF))

    assert pcie.problems == ["dcgmi diag Integration/PCIe: Fail - All"]
    assert persistence.ok
    assert persistence.notes == ["dcgmi diag Deployment/Persistence Mode: Fail"]


def test_a_hardware_xid_in_the_kernel_log_fails_the_node_and_an_applications_xid_does_not() -> None:
    fallen = check_node(expected_gpus=8, run=FakeTools(dmesg=XID_13 + XID_79))
    app_error = check_node(expected_gpus=8, run=FakeTools(dmesg=XID_13))

    assert fallen.problems == ["XID 79 on PCI:0000:00:1e"]
    assert app_error.ok


def test_a_failing_nvidia_smi_on_a_gpu_type_fails_the_node() -> None:
    said = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    health = check_node(expected_gpus=1, run=FakeTools(smi=said, smi_code=9))

    assert health.problems == [f"nvidia-smi failed (exit 9): {said}"]


def test_a_host_without_nvidia_smi_or_a_cpu_type_has_no_gpus_to_check() -> None:
    local = check_node(expected_gpus=1, run=FakeTools(smi=None, dcgmi=None))
    cpu = FakeTools()
    on_cpu = check_node(expected_gpus=0, run=cpu)

    assert local.ok
    assert not local.gpus_seen
    assert not on_cpu.gpus_seen
    assert local.summary() == "no GPUs to check (no nvidia-smi on this host)"
    assert on_cpu.ok
    assert on_cpu.summary() == "no GPUs to check (a CPU type)"
    assert cpu.calls == []


def test_without_dcgm_the_diagnostics_are_skipped_and_said_so() -> None:
    health = check_node(expected_gpus=8, run=FakeTools(dcgmi=None))

    assert health.ok
    assert health.notes == ["no dcgmi on this host: DCGM diagnostics skipped"]


def test_only_xids_logged_after_the_workload_started_are_its_hardware_fault() -> None:
    before = hardware_xids(XID_79)

    assert hardware_fault(before, run=FakeTools(dmesg=XID_79)) is None
    later = XID_79.replace("8210.339146", "9100.000001").replace(": 79,", ": 48,")
    assert hardware_fault(before, run=FakeTools(dmesg=XID_79 + later)) == "hardware fault: XID 48 on PCI:0000:00:1e"
    assert hardware_xids(XID_79 + XID_13) == [Xid("PCI:0000:00:1e", 79, XID_79.strip())]


def test_fake_tools_on_path_play_an_unhealthy_node_through_real_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the local cloud does to play a bad host: a PATH folder with a fake nvidia-smi."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        f"#!{sys.executable}\nimport sys\nopen({str(tmp_path / 'argv')!r}, 'w').write(repr(sys.argv[1:]))\n"
        "print('0, 00000000:00:1E.0, 0, No')\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))

    health = check_node(expected_gpus=4, run=run_tool)

    assert health.problems == ["nvidia-smi sees 1 GPU(s), the type has 4"]
    assert (tmp_path / "argv").read_text() == repr(list(NVIDIA_SMI_ARGV[1:]))
    assert "no dcgmi on this host: DCGM diagnostics skipped" in health.notes
