"""tcmalloc for torch on CPU: the torch backend's worker, and every Python model's process.

With glibc malloc, torch on CPU spends 30-60% of its time in the kernel
returning and fetching memory between batches; preloading tcmalloc made
EfficientNet 2-3.5x faster at batch 8-32 here (docs/performance.md). LD_PRELOAD
only works from the start of a process, so the worker re-executes itself once
with it set, and a model's process (worker/model_process.py) starts with it.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

CANDIDATES = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
              "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4")


def tcmalloc_path() -> str | None:
    for path in CANDIDATES:
        if Path(path).exists():
            return path
    name = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    return name


def with_tcmalloc(env: dict[str, str]) -> dict[str, str] | None:
    """`env` with tcmalloc preloaded; None if it is preloaded already, or not installed."""
    if "tcmalloc" in env.get("LD_PRELOAD", ""):
        return None
    library = tcmalloc_path()
    if not library:
        log.info("tcmalloc not installed (Debian: libtcmalloc-minimal4); torch uses glibc malloc")
        return None
    return {**env, "LD_PRELOAD": " ".join(filter(None, [library, env.get("LD_PRELOAD")]))}


def preload_tcmalloc(argv: list[str]) -> None:
    """Re-execute this worker with tcmalloc preloaded, if it is installed and not loaded yet."""
    env = with_tcmalloc(dict(os.environ))
    if env is not None:
        os.execve(sys.executable, [sys.executable, "-m", "funnel.worker", *argv], env)
