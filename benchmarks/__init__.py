"""Funnel's benchmarks: not installed; run them as modules from the repository root,
`python -m benchmarks.bench`, `python -m benchmarks.core`, `python -m benchmarks.cuda_shapes`."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
