"""Starting and stopping the child processes `funnel up` and the tests start."""

from __future__ import annotations

import subprocess
from typing import Self


class Service:
    """Something with start() and stop(): a with-block stops it, also when it failed halfway through starting."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


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
