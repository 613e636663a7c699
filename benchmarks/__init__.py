"""Funnel's benchmarks: not installed; run them as modules from the repository root,
`python -m benchmarks.bench`, `python -m benchmarks.core`, `python -m benchmarks.cuda_shapes`."""

import datetime as dt
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def save(name: str, report: str) -> Path:
    """Print a Markdown report and keep it as benchmarks/results/<name>-<date>-<time>.md."""
    print(report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}-{dt.datetime.now():%Y%m%d-%H%M}.md"
    out.write_text(report)
    print(f"saved {out.relative_to(ROOT)}")
    return out


def commit_of(checkout: Path) -> str:
    """The short commit a checkout holds (its folder's name if git cannot tell): how a --before
    run labels its rows."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or checkout.name
