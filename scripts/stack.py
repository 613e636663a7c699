"""`funnel up`: the whole stack as plain processes: Redis, the web tier, the gRPC service, the workers
for each model (as many as suit the host's cores, scripts/layout.py, unless told).

`make up` runs this; the end-to-end tests and benchmarks use the Stack class
to start exactly what a user starts. Each worker serves its model's highest
version in the store at its start; a worker of the Stack class may be given
NAME:N instead of a model name to serve version N (start_worker, workers).

    funnel up [--port 8000] [--redis-port 6390] [--model-store model_store] [--backend onnx]
              [--batch-size N | MODEL=N,...] [--linger-ms MS | MODEL=MS,...] [--workers-per-model N]
              [--grpc-port 8001 | --no-grpc] [--log-dir DIR] [--[no-]front-door]

`funnel up --help` tells each option. Every other FUNNEL_* variable in its
environment reaches the tier whose setting it is (docs/operations.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from funnel.common import settings
from funnel.common.store import list_models
from funnel.scripts import layout, processes
from funnel.scripts.front_door import FrontDoor, nginx_binary
from funnel.scripts.redis_local import LocalRedis, free_port
from funnel.web.settings import WebSettings
from funnel.worker.settings import WorkerSettings


def model_name(model: str) -> str:
    """A worker's model without its version: "text-embedding:2" -> "text-embedding"."""
    return model.partition(":")[0]


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
                 workers: list[str] | None = None, front_door: bool = False, workers_per_model: int | None = 1,
                 model_env: dict[str, dict[str, str]] | None = None, grpc_port: int | None = None):
        self.port = port or free_port()
        self.grpc_port = grpc_port  # the gRPC service's (funnel-grpc), started with the web tier; None: none
        # With a front door, nginx listens on `port` and the web tier on a private one behind it.
        self.web_port = free_port() if front_door else self.port
        self.front_door: FrontDoor | None = None
        self.wants_front_door = front_door
        self.model_store = str(Path(model_store).resolve())
        self.models = models or list_models(self.model_store)
        # workers_per_model N (None: what suits this host's cores, scripts/layout.py), each with its
        # share of the cores' threads; or the models each worker is for.
        self.layout = layout.choose(layout.cores(), (worker_env or {}).get("FUNNEL_DEVICE", "cpu"), workers_per_model)
        self.worker_models = ([m for m in self.models for _ in range(self.layout.workers_per_model)]
                              if workers is None else workers)
        self.worker_env = {**self.layout.worker_env(), **(worker_env or {})}
        self.layout = self.layout.given(self.worker_env, layout.cores())  # the user's settings included
        self.model_env = model_env or {}  # model -> settings for its workers (of any version) alone, over worker_env
        self.web_env = web_env or {}
        self.redis = None if redis_url else LocalRedis(port=redis_port)
        self.redis_url = redis_url or self.redis.url
        self.log_dir = log_dir
        self.web: subprocess.Popen | None = None
        self.grpc: subprocess.Popen | None = None
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

    def worker_environment(self, model: str, **env: str) -> dict[str, str]:
        """The environment a worker for `model` (NAME, or NAME:N for version N) starts with: its
        settings are FUNNEL_* variables."""
        return self._env({"FUNNEL_MODEL": model, **self.worker_env, **self.model_env.get(model_name(model), {}),
                          **env})

    def web_environment(self, port: int, **env: str) -> dict[str, str]:
        """The environment of a web tier listening on `port` with this stack's settings: what
        start() gives its own, for a scenario that runs more web tiers on other ports (benchmarks/chaos.py)."""
        return self._env({"FUNNEL_HOST": "127.0.0.1", "FUNNEL_PORT": str(port),
                          "FUNNEL_MODELS": ",".join(self.models), **self.web_env, **env})

    def start_worker(self, model: str, **env: str) -> subprocess.Popen:
        """A worker for `model`: NAME serves its highest version in the store, NAME:N version N."""
        first, *others = model.split(",")  # a multi-model worker's log is named by its first model
        label = first.replace(":", "-v") + (f"-and-{len(others)}-more" if others else "")
        worker = self._spawn(f"worker-{label}-{len(self.workers)}", ["funnel.worker"],
                             self.worker_environment(model, **env))
        self.workers.append(worker)
        return worker

    def start(self, timeout_s: float = 120.0) -> Stack:
        if self.redis:
            self.redis.start()
        web_env = self._env({"FUNNEL_HOST": "127.0.0.1", "FUNNEL_PORT": str(self.web_port),
                             "FUNNEL_MODELS": ",".join(self.models), **self.web_env})
        self.web = self._spawn("web", ["funnel.web"], web_env)
        if self.grpc_port is not None:
            self.start_grpc()
        if self.wants_front_door:
            web = settings.load(WebSettings, [], environ=web_env)
            self.front_door = FrontDoor(self.port, self.web_port, max_body_mb=web.max_body_mb,
                                         timeout_s=web.request_timeout_s).start()
        for model in self.worker_models:
            self.start_worker(model)
        self.wait_ready(timeout_s)
        return self

    def grpc_environment(self) -> dict[str, str]:
        """The environment the gRPC service starts with: the web tier's settings, and its port."""
        return self._env({"FUNNEL_HOST": "127.0.0.1", "FUNNEL_GRPC_PORT": str(self.grpc_port),
                          "FUNNEL_MODELS": ",".join(self.models), **self.web_env})

    def start_grpc(self) -> subprocess.Popen:
        """The gRPC service (funnel-grpc) on grpc_port; a fault test may call it again once the one
        before has exited."""
        self.grpc = self._spawn("grpc", ["funnel.web.grpc"], self.grpc_environment())
        return self.grpc

    def wait_grpc(self, timeout_s: float = 60) -> None:
        """Until the gRPC service accepts connections (it binds once its models are loaded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.grpc_port), timeout=1).close()
                return
            except OSError:
                if self.grpc is not None and self.grpc.poll() is not None:
                    raise RuntimeError(f"the gRPC service exited with {self.grpc.returncode}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the gRPC service did not listen within {timeout_s} s") from None
                time.sleep(0.1)

    def wait_ready(self, timeout_s: float, expected: dict[str, int] | None = None) -> None:
        """Until the web answers and each model has its live workers (default: one per worker started)."""
        if expected is None:
            names = [model_name(m) for m in self.worker_models]
            expected = {m: names.count(m) for m in names}
        deadline = time.monotonic() + timeout_s
        if self.grpc_port is not None:
            self.wait_grpc(timeout_s)
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
        from funnel.web.auth import split_entry  # `label=KEY` entries: the KEY is the token

        keys = self.web_env.get("FUNNEL_API_KEYS") or os.environ.get("FUNNEL_API_KEYS", "")
        first = keys.split(",")[0].strip()
        return {"Authorization": f"Bearer {split_entry(first)[1]}"} if first else {}

    def stop(self) -> None:
        if self.front_door:
            self.front_door.stop()
        procs = [p for p in [*self.workers, self.web, self.grpc] if p and p.poll() is None]
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


# Settings `funnel up` decides itself for every process it starts (the Redis it started, the store
# resolved, each worker's model and unique id, the web's address and models), or through its own options.
DECIDED = {"redis_url", "model_store", "model", "worker_id", "host", "port", "models", "backend"}


def tier_env(cls: type, environ: Mapping[str, str]) -> dict[str, str]:
    """The FUNNEL_* variables in environ that name one of cls's settings, less those `funnel up` decides."""
    names = {settings.env_name(f.name) for f in dataclasses.fields(cls) if f.name not in DECIDED}
    return {name: value for name, value in environ.items() if name in names}


def per_model(kind: type) -> Callable[[str], dict[str, str]]:
    """An argparse type: VALUE for every model, or MODEL=VALUE,... for some; {model or "": "value"}."""

    def parse(text: str) -> dict[str, str]:
        values = {}
        for part in text.split(","):
            model, _, value = part.strip().rpartition("=")
            values[model] = str(kind(value))  # kind() raises ValueError: argparse reports the option
        return values

    parse.__name__ = f"{kind.__name__} or MODEL={kind.__name__},..."  # how argparse names a bad value
    return parse


def for_each_model(models: list[str], option: str, values: dict[str, str]) -> dict[str, str]:
    """{model: value} from a per_model option's values, for the models it covers; naming a model
    not served is an error, as it would change nothing."""
    unknown = sorted(set(values) - {"", *models})
    if unknown:
        raise SystemExit(f"funnel up: {option} names {', '.join(unknown)}, not among the models served "
                         f"({', '.join(models)})")
    return {m: values[m] if m in values else values[""] for m in models if m in values or "" in values}


def options(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="funnel up",
        description="Run Redis, the web tier and the workers for each model (as many as suit the host), until "
                    "Ctrl-C or SIGTERM.",
        epilog="Every other FUNNEL_* variable in the environment reaches the tier whose setting it is "
               "(funnel-web --help, funnel-worker --help); the options above win over them.")
    parser.add_argument("--port", type=int, default=int(environ.get("FUNNEL_PORT", 8000)),
                        help="port the stack answers HTTP on: nginx's with a front door, else the web tier's "
                             "(default: %(default)s, from FUNNEL_PORT when set)")
    parser.add_argument("--redis-port", type=int, default=6390,
                        help="port of the private redis-server funnel up starts; not used when FUNNEL_REDIS_URL "
                             "names a Redis of your own, which is used instead (default: %(default)s)")
    parser.add_argument("--model-store", metavar="DIR", default=environ.get("FUNNEL_MODEL_STORE", "model_store"),
                        help="model store folder (funnel prepare builds it); every model in it is served, "
                             "each at its highest version (default: %(default)s, from FUNNEL_MODEL_STORE when set)")
    parser.add_argument("--backend", default=environ.get("FUNNEL_BACKEND", "onnx"), choices=["onnx", "torch"],
                        help="the workers' inference backend: onnx (ONNX Runtime) or torch (TorchScript) "
                             "(default: %(default)s, from FUNNEL_BACKEND when set)")
    parser.add_argument("--batch-size", type=per_model(int), default=None, metavar="N|MODEL=N,...",
                        help="most jobs in one batch: N for every model's workers, or MODEL=N,... for some "
                             "(default: FUNNEL_BATCH_SIZE when set, else each model's own from its model.json: "
                             "16 image, 32 text)")
    parser.add_argument("--linger-ms", type=per_model(float), default=None, metavar="MS|MODEL=MS,...",
                        help="longest a worker waits for more jobs once it holds one, in ms; it waits only "
                             "while the batch holds fewer items than are expected within a run's fixed cost. MS "
                             "for every model's workers, or MODEL=MS,... for some (default: FUNNEL_LINGER_MS "
                             "when set, else 5)")
    parser.add_argument("--workers-per-model", type=int, metavar="N",
                        default=int(environ["FUNNEL_WORKERS_PER_MODEL"]) if environ.get("FUNNEL_WORKERS_PER_MODEL")
                        else None,
                        help="worker processes per model, each with its share of the cores' threads and no "
                             "spin-waiting when several share them (default: FUNNEL_WORKERS_PER_MODEL when set; "
                             f"else {layout.WORKERS_ON_CPU} when the models run on the CPU of a host with at least "
                             f"{layout.WORKERS_ON_CPU} cores, one on a GPU; funnel up says what it chose)")
    parser.add_argument("--grpc-port", type=int, default=int(environ.get("FUNNEL_GRPC_PORT", 8001)),
                        help="port of the Open Inference Protocol's gRPC service (funnel-grpc) "
                             "(default: %(default)s, from FUNNEL_GRPC_PORT when set)")
    parser.add_argument("--grpc", action=argparse.BooleanOptionalAction, default=True,
                        help="start the gRPC service beside the web tier (default: %(default)s)")
    parser.add_argument("--log-dir", default=None, metavar="DIR",
                        help="write each process's log to a file of its own in this folder "
                             "(default: all to this terminal)")
    parser.add_argument("--front-door", action=argparse.BooleanOptionalAction, default=nginx_binary() is not None,
                        help="nginx in front of the web tier, so slow clients cannot hold its threads "
                             "(default: on when nginx is installed; here %(default)s)")
    return parser


def build(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> Stack:
    """The Stack `funnel up` starts for these options and this environment (nothing started yet)."""
    args = options(environ).parse_args(argv)
    if not args.front_door:
        print("funnel up: no nginx in front (--no-front-door, or nginx not installed): clients that "
              "send slowly can hold the web tier's threads", file=sys.stderr)
    models = list_models(args.model_store)
    per_model_env: dict[str, dict[str, str]] = {m: {} for m in models}
    for option, variable, values in (("--batch-size", "FUNNEL_BATCH_SIZE", args.batch_size),
                                     ("--linger-ms", "FUNNEL_LINGER_MS", args.linger_ms)):
        for model, value in for_each_model(models, option, values or {}).items():
            per_model_env[model][variable] = value
    return Stack(port=args.port, redis_port=args.redis_port, model_store=args.model_store, models=models,
                 redis_url=environ.get("FUNNEL_REDIS_URL"),
                 worker_env={**tier_env(WorkerSettings, environ), "FUNNEL_BACKEND": args.backend},
                 web_env=tier_env(WebSettings, environ), model_env=per_model_env,
                 workers_per_model=args.workers_per_model,
                 log_dir=Path(args.log_dir) if args.log_dir else None, front_door=args.front_door,
                 grpc_port=args.grpc_port if args.grpc else None)


def main(argv: list[str] | None = None) -> int:
    stack = build(argv)
    web = settings.load(WebSettings, [], environ=stack.web_environment(stack.web_port))
    device = stack.worker_env.get("FUNNEL_DEVICE", "cpu")
    print(f"funnel up: {stack.layout.describe(layout.cores(), device, web.process_count())}", file=sys.stderr,
          flush=True)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        stack.start()
        grpc_at = f", gRPC at 127.0.0.1:{stack.grpc_port}" if stack.grpc_port is not None else ""
        print(f"\nFunnel is ready at {stack.url}{grpc_at}  (models: {', '.join(stack.models)}; "
              f"Redis {stack.redis_url}). Ctrl-C stops everything.\n", flush=True)
        while not stopping.wait(1.0):
            dead = [p for p in [stack.web, stack.grpc, *stack.workers, stack.front_door]
                    if p and p.poll() is not None]
            if dead:
                print(f"{getattr(dead[0], 'args', 'nginx')} exited; stopping", file=sys.stderr)
                return 1
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
