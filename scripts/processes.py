"""Stopping the child processes `funnel up` and the tests start."""

from __future__ import annotations

import subprocess


def stop(process: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait up to timeout_s, then SIGKILL; nothing to do if it has exited."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
