"""The tree is clean under ruff's lint and its formatter, as pyproject.toml configures them
(`ruff format .` and `ruff check --fix .` fix most of what this reports)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).parent / "ruff"


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_is_clean(command):
    proc = subprocess.run([str(RUFF), *command], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
