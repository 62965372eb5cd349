"""The domain stays pure, the layers stay in order, and the packages import one way only.

The import-linter contracts in pyproject.toml check imports statically; the tests below add what
they cannot see: a name in a string, and what a fresh interpreter actually loads.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout
    assert "0 broken" in result.stdout


def test_the_domain_imports_nothing_from_aws_in_a_fresh_interpreter() -> None:
    code = (
        "import sys, gpujobs.domain.spec, gpujobs.domain.job, gpujobs.domain.states, gpujobs.domain.ladder,"
        " gpujobs.domain.rundoc, gpujobs.domain.budget, gpujobs.domain.budget_alerts, gpujobs.domain.cost,"
        " gpujobs.domain.cost_anomaly, gpujobs.domain.fate, gpujobs.domain.effects, gpujobs.domain.decisions,"
        " gpujobs.domain.launching; bad = [m for m in sys.modules if m.split('.')[0] in"
        " ('boto3', 'botocore', 'aws_lambda_powertools')]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_layer_never_names_the_cli_or_the_local_cloud() -> None:
    """`grep -r gpujobs_local layers/` is empty: no import, lazy or by string, from the layer outward."""
    mentions = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "layers").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
        for name in ("gpujobs_local", "gpujobs_cli")
        if name in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert mentions == []


def test_the_cli_runs_without_loading_the_local_cloud() -> None:
    """The CLI finds `gpujobs local` by entry point, so its own commands never import gpujobs_local."""
    code = (
        "import contextlib, io, sys; from gpujobs_cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): code = main(['--help'])\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['validate', 'examples/digits.yaml'])\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'gpujobs_local']; print(bad)\n"
        "sys.exit(1 if bad or code else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


MODULE_LINE_LIMIT = 450
"""A module past a few hundred lines is holding two ideas (STYLE.md); this is the hard ceiling."""


def test_no_module_is_over_the_line_limit() -> None:
    folders = ("layers", "local", "cli", "functions", "fakes", "training_image/gpujobs_trainer")
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
    }
    assert sizes
    assert {path: lines for path, lines in sizes.items() if lines > MODULE_LINE_LIMIT} == {}


PACKAGES = ("gpujobs", "gpujobs_cli", "gpujobs_local", "gpujobs_trainer", "gpujobs_fakes")


def import_circles(package: str) -> list[list[str]]:
    """Every set of the package's modules that import each other round in a circle, counting every
    import statement grimp finds (lazy ones and those under TYPE_CHECKING included)."""
    import grimp

    graph = grimp.build_graph(package)
    inside = sorted(m for m in graph.modules if m == package or m.startswith(f"{package}."))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []
    for root in inside:  # Tarjan's strongly connected components, iteratively
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            module, children = work[-1]
            child = next((c for c in children if c in inside), None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    part = stack[stack.index(module) :]
                    del stack[stack.index(module) :]
                    if len(part) > 1:
                        circles.append(sorted(part))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
            elif child in stack:
                low[module] = min(low[module], index[child])
    return circles


def test_no_package_has_an_import_circle() -> None:
    assert {package: import_circles(package) for package in PACKAGES} == {package: [] for package in PACKAGES}
