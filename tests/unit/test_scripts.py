"""The scripts run as `python scripts/<name>.py` (their folder first on sys.path)."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("script", ["prepare_model.py", "stack.py", "inspect_redis.py"])
def test_script_starts(script):
    done = subprocess.run([sys.executable, f"scripts/{script}", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_no_script_shadows_a_standard_module():
    names = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    assert not names & set(sys.stdlib_module_names)
