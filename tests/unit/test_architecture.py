"""The domain stays pure and the layers stay in order (import-linter contracts in pyproject.toml)."""

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
        " gpujobs.domain.rundoc, gpujobs.domain.fate, gpujobs.domain.effects, gpujobs.domain.decisions,"
        " gpujobs.domain.launching; bad = [m for m in sys.modules if m.split('.')[0] in"
        " ('boto3', 'botocore', 'aws_lambda_powertools')]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
