"""The project's lint rules (pyproject.toml, [tool.ruff]: pycodestyle errors and warnings, pyflakes, import order,
pyupgrade) hold on every file: a new unused import, an unsorted import block or an outdated idiom fails here."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                         cwd=ROOT, capture_output=True, text=True)
    assert "No module named ruff" not in run.stderr, "ruff is not installed: bash scripts/install.sh (the test extra)"
    assert run.returncode == 0, run.stdout + run.stderr
