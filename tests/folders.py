"""Which markers a test's folder gives it, so that `make unit` (`-m "not integration and not
training"`) never runs a moto, template, container or torch test, whatever a module forgot to mark.

- tests/integration: moto, the rendered template, `sam build`, runc: `integration`.
- tests/training: real torch processes: `training`.
- tests/e2e: local clouds that run the real bootstrap and trainer: both.

Every `training` test (torch processes) and every test of a module that starts a local cloud is
put in one pytest-xdist group: under `-n auto` they run one at a time on one worker, as they did
before the suite ran in parallel (two at once on a 2-core machine starve each other's DDP ranks
and their waits time out), while the other workers take the unit, service, function and moto tests.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FOLDER_MARKERS: dict[str, tuple[str, ...]] = {
    "integration": ("integration",),
    "training": ("training",),
    "e2e": ("integration", "training"),
}
TORCH_GROUP = "torch"


def markers_of(path: Path) -> tuple[str, ...]:
    """The markers a test module at `path` gets from its folder (none outside the three)."""
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return ()
    return FOLDER_MARKERS.get(folder, ())


@functools.cache
def starts_a_local_cloud(path: Path) -> bool:
    """The module builds a local cloud (moto server, handlers, instance processes) in its tests."""
    text = path.read_text(encoding="utf-8")
    return "LocalCloud(" in text or "local_session(" in text


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        for name in markers_of(path):
            if item.get_closest_marker(name) is None:
                item.add_marker(name)
        if item.get_closest_marker("training") is not None or starts_a_local_cloud(path):
            item.add_marker(pytest.mark.xdist_group(TORCH_GROUP))
