"""`funnel up`: the whole stack as plain processes: Redis, the web tier, one worker per model.

`make up` runs this; the end-to-end tests and benchmarks use the Stack class
to start exactly what a user starts.

    funnel up [--port 8000] [--redis-port 6390] [--backend onnx] [worker flags...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from funnel.common import settings
from funnel.common.store import list_models
from funnel.scripts import processes
from funnel.scripts.front_door import FrontDoor, nginx_binary
from funnel.scripts.redis_local import LocalRedis, free_port
from funnel.web.settings import WebSettings


def get_json(url: str, timeout: float = 2.0, headers: dict | None = None) -> dict:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


class Stack(processes.Service):
    """Redis + web + workers, each a child process with FUNNEL_* settings."""

    def __init__(self, *, port: int | None = None, redis_url: str | None = None,
                 model_store: str | Path = "model_store", models: list[str] | None = None,
                 worker_env: dict[str, str] | None = None, web_env: dict[str, str] | None = None,
                 redis_port: int | None = None, log_dir: Path | None = None,
                 workers: list[str] | None = None, front_door: bool = False, workers_per_model: int = 1):
        self.port = port or free_port()
        # With a front door, nginx listens on `port` and the web tier on a private one behind it.
        self.web_port = free_port() if front_door else self.port
        self.front_door: FrontDoor | None = None
        self.wants_front_door = front_door
        self.model_store = str(Path(model_store).resolve())
        self.models = models or list_models(self.model_store)
        # One worker per model unless told: workers_per_model N, or the models each worker is for.
        self.worker_models = [m for m in self.models for _ in range(workers_per_model)] if workers is None else workers
        self.worker_env = worker_env or {}
        if workers_per_model > 1:
            # Workers sharing a host's cores: each takes its share of them, and none spin-waits on
            # cores the others (and the web tier) need. Single-threaded sessions side by side did
            # more per core than one session on all of them (benchmarks/README.md).
            self.worker_env = {"FUNNEL_INTRA_OP_THREADS": str(max(1, (os.cpu_count() or 1) // workers_per_model)),
                               "FUNNEL_SPINNING": "0", **self.worker_env}
        self.web_env = web_env or {}
        self.redis = None if redis_url else LocalRedis(port=redis_port)
        self.redis_url = redis_url or self.redis.url
        self.log_dir = log_dir
        self.web: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUNNEL_")}
        env.update(FUNNEL_REDIS_URL=self.redis_url, FUNNEL_MODEL_STORE=self.model_store,
                   PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        out = None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "ab")
        return subprocess.Popen([sys.executable, "-m", *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT if out else None)

    def start_worker(self, model: str, **env: str) -> subprocess.Popen:
        worker = self._spawn(f"worker-{model}-{len(self.workers)}", ["funnel.worker"],
                             self._env({"FUNNEL_MODEL": model, **self.worker_env, **env}))
        self.workers.append(worker)
        return worker

    def start(self, timeout_s: float = 120.0) -> Stack:
        if self.redis:
            self.redis.start()
        web_env = self._env({"FUNNEL_HOST": "127.0.0.1", "FUNNEL_PORT": str(self.web_port),
                             "FUNNEL_MODELS": ",".join(self.models), **self.web_env})
        self.web = self._spawn("web", ["funnel.web"], web_env)
        if self.wants_front_door:
            web = settings.load(WebSettings, [], environ=web_env)
            self.front_door = FrontDoor(self.port, self.web_port, web.max_body_mb, web.request_timeout_s).start()
        for model in self.worker_models:
            self.start_worker(model)
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float, expected: dict[str, int] | None = None) -> None:
        """Until the web answers and each model has its live workers (default: one per worker started)."""
        if expected is None:
            expected = {m: self.worker_models.count(m) for m in self.worker_models}
        deadline = time.monotonic() + timeout_s
        while not self._ready(expected):
            if self.web.poll() is not None:
                raise RuntimeError(f"the web tier exited with {self.web.returncode}")
            if time.monotonic() > deadline:
                dead = [p.args for p in self.workers if p.poll() is not None]
                raise TimeoutError(f"stack not ready after {timeout_s} s; exited workers: {dead}")
            time.sleep(0.1)

    def _ready(self, expected: dict[str, int]) -> bool:
        try:
            if not expected:  # nothing to count: the web answering at all is enough
                return bool(urllib.request.urlopen(f"{self.url}/healthz", timeout=2).status)
            listing = get_json(f"{self.url}/v1/models", headers=self._auth())
        except urllib.error.HTTPError:
            return not expected
        except (urllib.error.URLError, ConnectionError, OSError):
            return False
        served = {m["name"]: len(m["workers"]) for m in listing["models"]}
        return all(served.get(model, 0) >= n for model, n in expected.items())

    def _auth(self) -> dict:
        """The management routes need a key when the web tier has API keys."""
        keys = self.web_env.get("FUNNEL_API_KEYS") or os.environ.get("FUNNEL_API_KEYS", "")
        first = keys.split(",")[0].strip()
        return {"Authorization": f"Bearer {first}"} if first else {}

    def stop(self) -> None:
        if self.front_door:
            self.front_door.stop()
        procs = [p for p in [*self.workers, self.web] if p and p.poll() is None]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.redis:
            self.redis.stop()



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run Redis, the web tier and one worker per model.")
    parser.add_argument("--port", type=int, default=int(os.environ.get("FUNNEL_PORT", 8000)))
    parser.add_argument("--redis-port", type=int, default=6390,
                        help="port of the private redis-server (ignored with FUNNEL_REDIS_URL)")
    parser.add_argument("--model-store", default=os.environ.get("FUNNEL_MODEL_STORE", "model_store"))
    parser.add_argument("--backend", default=os.environ.get("FUNNEL_BACKEND", "onnx"))
    parser.add_argument("--workers-per-model", type=int, default=int(os.environ.get("FUNNEL_WORKERS_PER_MODEL", 1)),
                        help="worker processes per model; on a CPU-only host serving one model, one per core "
                             "(each with its share of the cores' threads) served text best")
    parser.add_argument("--log-dir", default=None, help="write each process's log here instead of the terminal")
    parser.add_argument("--front-door", action=argparse.BooleanOptionalAction, default=nginx_binary() is not None,
                        help="nginx in front of the web tier, so slow clients cannot hold its threads "
                             "(default: on when nginx is installed)")
    args = parser.parse_args(argv)
    if not args.front_door:
        print("funnel up: no nginx in front (--no-front-door, or nginx not installed): clients that "
              "send slowly can hold the web tier's threads", file=sys.stderr)
    stack = Stack(port=args.port, redis_port=args.redis_port, model_store=args.model_store,
                  redis_url=os.environ.get("FUNNEL_REDIS_URL"),
                  worker_env={"FUNNEL_BACKEND": args.backend}, workers_per_model=args.workers_per_model,
                  log_dir=Path(args.log_dir) if args.log_dir else None, front_door=args.front_door)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        stack.start()
        print(f"\nFunnel is ready at {stack.url}  (models: {', '.join(stack.models)}; "
              f"Redis {stack.redis_url}). Ctrl-C stops everything.\n", flush=True)
        while not stopping.wait(1.0):
            dead = [p for p in [stack.web, *stack.workers, stack.front_door] if p and p.poll() is not None]
            if dead:
                print(f"{getattr(dead[0], 'args', 'nginx')} exited; stopping", file=sys.stderr)
                return 1
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
