"""benchmarks.paired's comparison of code: another revision's Funnel run beside this tree's."""

import os
import subprocess
import sys
from collections import Counter

from benchmarks import ROOT
from benchmarks.paired import orders
from benchmarks.web_cpu import code


def test_a_revision_is_imported_as_funnel_from_its_own_copy(tmp_path):
    """The stack --against starts imports that commit's Funnel, the public names (sdk/) included."""
    path = code(tmp_path, "HEAD")
    found = subprocess.run([sys.executable, "-c", "import funnel, funnel.worker.linger as l; from funnel import Task; "
                            "print(funnel.__file__); print(l.__file__)"],
                           env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, check=True)
    package, module = found.stdout.split()
    assert package.startswith(path) and module.startswith(path)
    assert os.path.realpath(module).startswith(str(tmp_path / "src"))


def test_each_run_leads_and_follows_every_other_equally():
    rounds = [orders(2, i) for i in range(6)]
    assert all(sorted(r) == ["ceiling", "stack0", "stack1"] for r in rounds)
    firsts = Counter(r[0] for r in rounds)
    after = Counter((a, b) for r in rounds for a, b in zip(r, r[1:]))
    assert set(firsts.values()) == {2}
    assert set(after.values()) == {2} and len(after) == 6  # each of the six orderings of two runs, twice


def test_it_runs_as_a_module():
    shown = subprocess.run([sys.executable, "-m", "benchmarks.paired", "--help"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    assert "--against REVISION" in shown
