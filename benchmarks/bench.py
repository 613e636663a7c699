"""Funnel against its peers, same machine, same model: throughput, latency and CPU per request.

    python benchmarks/bench.py [--models text-embedding,image-classifier] [--suite same,default]
                               [--backend onnx|torch] [--concurrency 1,8,32,128] [--duration 10]
                               [--rounds 3] [--systems ceiling,flask,streamer,litserve,funnel] [--quick]
                               [--device cpu|cuda:N] [--store PATH] [--web-processes N]
                               [--funnel-env FUNNEL_X=value ...]

Systems (each started as subprocesses on free ports of 127.0.0.1, stopped after its run):
  ceiling   the model called in-process, batch 1 and batch 32, no HTTP
  flask     plain Flask, gunicorn -w 2 (sync), one model per process, 1 intra-op thread, no batching
  streamer  service-streamer RedisStreamer: gunicorn -k gevent -w 2 + 1 model worker
            (batch 32, max latency 20 ms), its own private Redis
  litserve  LitServe, max_batch_size 32, batch_timeout 0.02 s
  funnel    scripts.stack.Stack with default settings (what `make up` starts), serving this model
--web-processes N gives every web tier N processes (gunicorn -w N, LitServe num_api_servers=N,
FUNNEL_PROCESSES=N); --device cuda:N puts every model (peers, ceiling, Funnel's worker) on that GPU.

Suites:
  same      every system serves Funnel's exported model (model_store) through worker.backend
            (--backend onnx or torch) and the task modules: only the serving layer differs
  default   the peers as their docs show them, PyTorch eager; Funnel as it ships (ONNX)

Each system is driven by wrk (-t1, a Lua script POSTing one sentence or the cat JPEG, --latency)
at each concurrency; requests/s, p50/p99, non-2xx and socket errors, and the CPU seconds its
web tier, model process(es) and Redis used (from /proc/<pid>/stat) are recorded. Results go to
benchmarks/results/bench-<model>-<date>.md (+ .json, + PNG plots).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import importlib.metadata as md
import io
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.redis_local import LocalRedis, free_port  # noqa: E402
from scripts.stack import Stack  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TEXT, IMAGE = "text-embedding", "image-classifier"
MODELS = (TEXT, IMAGE)
SENTENCE = "A man is eating a piece of bread while the girl is carrying a baby."
CAT_CLASSES = range(281, 286)  # ImageNet's domestic cats; chelsea is 285 "Egyptian cat"
SYSTEMS = ("ceiling", "flask", "streamer", "litserve", "funnel")
PEERS = ("flask", "streamer", "litserve")
LABELS = {
    "ceiling": "in-process ceiling (no HTTP)",
    "flask": "Flask + gunicorn -w2, no batching",
    "streamer": "service-streamer RedisStreamer",
    "litserve": "LitServe, batching",
    "funnel": "Funnel (defaults)",
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
READY_TIMEOUT_S = 240.0


# -- machine -----------------------------------------------------------------


def version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        return re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text()).group(1)
    except (OSError, AttributeError):
        return "unknown CPU"


def machine() -> dict:
    cpu = cpu_model()
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0]
    return {
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "wrk": " ".join(wrk_version.split()[:2]),
        "packages": {d: version(d) for d in (
            "onnxruntime", "torch", "transformers", "numpy", "pillow-simd", "flask", "gunicorn",
            "gevent", "service_streamer", "litserve", "fastapi", "uvicorn", "redis")},
    }


def gpu_name(device: str) -> str:
    """torch's name for the GPU, asked in a child process so that the driver does not import torch."""
    code = "import sys, torch; print(torch.cuda.get_device_name(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, device], check=False, capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"--device {device}: torch cannot use it: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# -- inputs ------------------------------------------------------------------


@dataclass
class Payload:
    body: bytes
    content_type: str
    kind: str  # what the body is, for the results file


def cat_jpeg() -> bytes:
    from PIL import Image
    from skimage import data

    out = io.BytesIO()
    Image.fromarray(data.chelsea()).save(out, format="JPEG", quality=90)
    return out.getvalue()


def multipart(field_name: str, filename: str, data: bytes, content_type: str) -> tuple[bytes, str]:
    boundary = "funnel-bench-boundary-7d1c"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field_name}\"; "
            f"filename=\"{filename}\"\r\nContent-Type: {content_type}\r\n\r\n").encode()
    body += data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def payload(model: str, system: str, jpeg: bytes) -> Payload:
    if model == TEXT:
        return Payload(json.dumps({"text": SENTENCE}).encode(), "application/json",
                       f"JSON {{\"text\": ...}}, one {len(SENTENCE.split())}-word sentence")
    if system == "litserve":  # LitServe parses JSON or forms, not raw bodies
        body, content_type = multipart("file", "cat.jpg", jpeg, "image/jpeg")
        return Payload(body, content_type, f"multipart field 'file', {len(jpeg)} B JPEG")
    return Payload(jpeg, "image/jpeg", f"raw image/jpeg body, {len(jpeg)} B")


def check_answer(model: str, status: int, body: bytes) -> str | None:
    """None when the answer is right, else what is wrong with it."""
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}"
    try:
        answer = json.loads(body)
    except ValueError:
        return f"not JSON: {body[:200]!r}"
    if model == TEXT:
        vector = answer.get("embedding")
        if not isinstance(vector, list) or len(vector) != 384:
            return f"no 384-d embedding: {str(answer)[:200]}"
        if abs(math.sqrt(sum(x * x for x in vector)) - 1) > 1e-3:
            return "embedding is not L2-normalised"
        return None
    predictions = answer.get("predictions") or [{}]
    if predictions[0].get("index") not in CAT_CLASSES:
        return f"first class is not a cat: {predictions[0]}"
    return None


def post(url: str, data: Payload, timeout: float = 60.0) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data.body, method="POST",
                                     headers={"Content-Type": data.content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# -- CPU accounting from /proc -----------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime+stime+cutime+cstime in ticks) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), sum(int(f) for f in fields[11:15])


def process_table() -> dict[int, tuple[int, int]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat:
                table[int(entry)] = stat
    return table


def tree(table: dict, roots: list[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def cpu_ticks(groups: dict[str, list[int]]) -> dict[str, dict[int, int]]:
    """Per group, per process: CPU ticks so far. A process is in the first group whose tree holds it
    (so list the model before the web when the model is a child of the web's process tree)."""
    table = process_table()
    taken: set[int] = set()
    out = {}
    for name, roots in groups.items():
        pids = tree(table, roots) - taken
        taken |= pids
        out[name] = {pid: table[pid][1] for pid in pids}
    return out


def cpu_seconds(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per group between two cpu_ticks(); processes born in between count whole."""
    return {name: sum(ticks - before.get(name, {}).get(pid, 0) for pid, ticks in procs.items()) / CLK_TCK
            for name, procs in after.items()}


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / CLK_TCK


# -- wrk ---------------------------------------------------------------------

WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "%(content_type)s"
local f = assert(io.open("%(body_file)s", "rb"))
wrk.body = f:read("*a")
f:close()
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %%d %%d %%d %%d %%d %%d %%d %%f %%f %%f\\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean))
end
"""


def write_lua(workdir: Path, name: str, data: Payload) -> Path:
    body_file = workdir / f"{name}.body"
    body_file.write_bytes(data.body)
    script = workdir / f"{name}.lua"
    script.write_text(WRK_LUA % {"content_type": data.content_type, "body_file": str(body_file)})
    return script


def wrk(url: str, script: Path, connections: int, duration_s: float, log) -> dict:
    args = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s:g}s", "--timeout", "30s", "--latency",
            "-s", str(script), url]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=duration_s + 90)
    log.write(f"$ {shlex.join(args)}\n{proc.stdout}{proc.stderr}\n")
    found = re.search(r"RESULT (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\S+) (\S+) (\S+)", proc.stdout)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stdout[-500:]} {proc.stderr[-500:]}")
    requests, duration_us, connect, read, write, status, timeout = (int(g) for g in found.groups()[:7])
    p50, p99, mean = (float(g) / 1000 for g in found.groups()[7:])
    seconds = duration_us / 1e6
    return {"requests": requests, "seconds": seconds, "rps": requests / seconds,
            "p50_ms": p50, "p99_ms": p99, "mean_ms": mean, "non2xx": status,
            "socket_errors": connect + read + write + timeout}


# -- systems -----------------------------------------------------------------


@dataclass
class Running:
    url: str
    groups: dict[str, list[int]]  # CPU accounting: web, model, redis -> root pids
    stop: callable
    procs: list[subprocess.Popen] = field(default_factory=list)
    stack: Stack | None = None

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)


def peer_env(model: str, impl: str, args, extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FUNNEL_", "BENCH_"))}
    env.update(BENCH_MODEL=model, BENCH_IMPL=impl, BENCH_STORE=args.store, BENCH_DEVICE=args.device,
               BENCH_WEB_PROCESSES=str(args.web_processes or 0),
               PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def spawn(args: list[str], env: dict, logfile: Path) -> subprocess.Popen:
    out = open(logfile, "ab")
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
    worker = spawn([sys.executable, str(ROOT / "benchmarks" / "peers" / "streamer_worker.py")], env,
                   workdir / "streamer-worker.log")
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
    server = spawn([sys.executable, str(ROOT / "benchmarks" / "peers" / "litserve_app.py"), str(port)],
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


def start_funnel(model: str, backend: str, args, workdir: Path) -> Running:
    # What `make up` starts (scripts/stack.py), default settings, serving the benchmarked model only.
    web_env = {"FUNNEL_PROCESSES": str(args.web_processes)} if args.web_processes else {}
    web_env.update(args.funnel_env)  # --funnel-env: a setting to compare against the default
    stack = Stack(models=[model], model_store=args.store, log_dir=workdir / "funnel", web_env=web_env,
                  worker_env={"FUNNEL_BACKEND": backend, "FUNNEL_DEVICE": args.device})
    stack.start(timeout_s=READY_TIMEOUT_S)
    return Running(f"{stack.url}/v1/models/{model}/predict",
                   {"web": [stack.web.pid], "model": [w.pid for w in stack.workers],
                    "redis": [stack.redis.process.pid]},
                   stack.stop, [stack.web, *stack.workers], stack)


STARTERS = {"flask": start_flask, "streamer": start_streamer, "litserve": start_litserve,
            "funnel": start_funnel}


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


def drain(running: Running, max_s: float = 180.0, quiet_cores: float = 0.25, window_s: float = 0.5) -> float:
    """Wait until the system has worked off what the last wrk run left queued (wrk stops sending, but
    requests already in a queue still run): until its processes use under quiet_cores. Seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < max_s:
        before = cpu_ticks(running.groups)
        time.sleep(window_s)
        if sum(cpu_seconds(before, cpu_ticks(running.groups)).values()) / window_s < quiet_cores:
            break
    return time.monotonic() - started


# -- Funnel's batches ----------------------------------------------------------


def funnel_counters(stack: Stack, model: str) -> dict[str, float]:
    """Summed counters (batches, items, batch_le_<n>) of this model's workers, from their registry hashes."""
    import redis

    client = redis.Redis.from_url(stack.redis_url)
    try:
        totals: dict[str, float] = {}
        for worker_id, served in client.hgetall("funnel:workers").items():
            if served.decode() != model:
                continue
            for name, value in client.hgetall(f"funnel:worker:{worker_id.decode()}").items():
                name = name.decode()
                if name in ("batches", "items") or name.startswith("batch_le_"):
                    totals[name] = totals.get(name, 0) + float(value)
        return totals
    finally:
        client.close()


def sample_batch_sizes(url: str, data: Payload, clients: int, total: int) -> list[int]:
    """meta.batch_size of `total` answers from `clients` concurrent keep-alive clients."""
    host, port_path = url.split("://", 1)[1].split(":", 1)
    port, path = port_path.split("/", 1)
    sizes: list[int] = []
    lock = threading.Lock()
    per_client = max(1, total // clients)

    def client():
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            for _ in range(per_client):
                conn.request("POST", "/" + path, body=data.body, headers={"Content-Type": data.content_type})
                response = conn.getresponse()
                body = response.read()
                if response.status == 200:
                    meta = json.loads(body).get("meta") or {}
                    if "batch_size" in meta:
                        with lock:
                            sizes.append(int(meta["batch_size"]))
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sizes


# -- one system, one round ---------------------------------------------------


def run_ceiling(model: str, impl: str, options, workdir: Path, data: Payload, log) -> dict:
    raw = workdir / f"ceiling-{model}.raw"
    raw.write_bytes(data.body)
    env = peer_env(model, impl, options, {})
    args = [sys.executable, "-m", "benchmarks.peers.ceiling", f"{options.duration:g}", str(raw)]
    busy_before, child_before = machine_busy_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    child_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (child_after.ru_utime - child_before.ru_utime + child_after.ru_stime - child_before.ru_stime)
    log.write(f"$ BENCH_IMPL={impl} {shlex.join(args)}\n{proc.stdout}{proc.stderr[-2000:]}\n")
    found = re.search(r"^CEILING (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"ceiling failed: {proc.stderr[-1000:]}")
    result = json.loads(found.group(1))
    result["other_cores"] = max(0.0, (machine_busy_s() - busy_before - child_cpu) / wall)
    return result


def run_system(system: str, model: str, impl: str, args, concurrency: list[int], workdir: Path,
               data: Payload, log) -> dict:
    started = time.monotonic()
    running = STARTERS[system](model, impl, args, workdir)
    result: dict = {"loadavg_before": loadavg(), "points": {}}
    try:
        wait_ready(running, model, data)
        result["startup_s"] = round(time.monotonic() - started, 1)
        script = write_lua(workdir, f"{system}-{model}", data)
        wrk(running.url, script, 32, args.warmup, log)  # warm-up, not recorded
        for c in concurrency:
            drained = drain(running)
            if drained > 5:
                print(f"    (waited {drained:.0f} s for the last run's queued requests)", flush=True)
            time.sleep(args.settle)  # idle between points, for every system alike
            counters = funnel_counters(running.stack, model) if running.stack else None
            before, busy_before = cpu_ticks(running.groups), machine_busy_s()
            wrk_cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            point = wrk(running.url, script, c, args.duration, log)
            wrk_cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            after, busy_after = cpu_ticks(running.groups), machine_busy_s()
            if not running.alive():
                raise RuntimeError(f"{system} died during the run at c={c}")
            cpu = cpu_seconds(before, after)
            wrk_cpu = (wrk_cpu_after.ru_utime - wrk_cpu_before.ru_utime
                       + wrk_cpu_after.ru_stime - wrk_cpu_before.ru_stime)
            done = max(point["requests"], 1)
            point["cpu_ms_per_request"] = {g: 1000 * s / done for g, s in cpu.items()}
            point["cpu_cores"] = {g: s / point["seconds"] for g, s in cpu.items()}
            point["wrk_cores"] = wrk_cpu / point["seconds"]
            # Everything else the machine did meanwhile (other jobs, the driver): the noise.
            point["other_cores"] = max(0.0, (busy_after - busy_before - sum(cpu.values()) - wrk_cpu)
                                       / point["seconds"])
            if counters is not None:
                drain(running)
                time.sleep(args.settle)  # the workers publish their counters every few seconds
                later = funnel_counters(running.stack, model)
                delta = {k: later.get(k, 0) - counters.get(k, 0) for k in later}
                point["funnel_batches"] = delta
                if delta.get("batches"):
                    point["mean_batch"] = delta["items"] / delta["batches"]
            result["points"][c] = point
            print(f"    c={c:<4} {point['rps']:8.1f} req/s  p50 {point['p50_ms']:7.1f} ms  "
                  f"p99 {point['p99_ms']:7.1f} ms  non-2xx {point['non2xx']}  socket errors "
                  f"{point['socket_errors']}  other load {point['other_cores']:.2f} cores"
                  + (f"  mean batch {point['mean_batch']:.1f}" if "mean_batch" in point else ""),
                  flush=True)
        if running.stack:
            drain(running)
            sizes = sample_batch_sizes(running.url, data, 32, args.batch_samples)
            result["batch_sample_c32"] = sizes
        result["loadavg_after"] = loadavg()
        return result
    finally:
        running.stop()


# -- aggregation and report ----------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def systems_of(suite: str, backend: str) -> list[tuple[str, str]]:
    """(system, implementation) pairs of a suite; the ceiling once per implementation."""
    if suite == "same":
        return [("ceiling", backend), ("flask", backend), ("streamer", backend),
                ("litserve", backend), ("funnel", backend)]
    return [("ceiling", "eager"), ("ceiling", "onnx"), ("flask", "eager"), ("streamer", "eager"),
            ("litserve", "eager"), ("funnel", "onnx")]


def suite_title(suite: str, backend: str) -> str:
    if suite == "same":
        return (f"Same backend ({backend}): every system serves Funnel's exported model through "
                f"worker.backend ({backend}) and the task modules")
    return ("What a user gets by default: the peers with PyTorch eager as their docs show, "
            "Funnel as it ships (ONNX)")


def fmt(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def summarize(rounds: list[dict], suite_key: str, pairs, concurrency) -> dict:
    """Medians over rounds: {name: {"ceiling": {...}} or {c: {...}}}."""
    out: dict = {}
    for system, impl in pairs:
        name = f"{system}:{impl}"
        runs = [r[suite_key][name] for r in rounds if name in r.get(suite_key, {})]
        if not runs:
            continue
        if system == "ceiling":
            out[name] = {k: med([r[k] for r in runs]) for k in ("batch1", "batch32", "batch32_pre")}
            out[name]["range32"] = (min(r["batch32"] for r in runs), max(r["batch32"] for r in runs))
            out[name]["description"] = runs[0]["description"]
            out[name]["other_cores"] = med([r.get("other_cores", float("nan")) for r in runs])
            continue
        out[name] = {}
        for c in concurrency:
            points = [r["points"][c] for r in runs if c in r["points"]]
            if not points:
                continue
            groups = sorted({g for p in points for g in p["cpu_ms_per_request"]})
            out[name][c] = {
                "rps": med([p["rps"] for p in points]),
                "rps_range": (min(p["rps"] for p in points), max(p["rps"] for p in points)),
                "p50_ms": med([p["p50_ms"] for p in points]),
                "p99_ms": med([p["p99_ms"] for p in points]),
                "non2xx": sum(p["non2xx"] for p in points),
                "socket_errors": sum(p["socket_errors"] for p in points),
                "cpu": {g: med([p["cpu_ms_per_request"].get(g, 0) for p in points]) for g in groups},
                "other_cores": med([p["other_cores"] for p in points]),
                "mean_batch": med([p["mean_batch"] for p in points if "mean_batch" in p]),
                "n": len(points),
            }
        sizes = [s for r in runs for s in r.get("batch_sample_c32", [])]
        if sizes:
            out[name]["batch_sample_c32"] = sizes
        hist: dict[int, dict[str, float]] = {}  # per concurrency, summed over rounds
        for r in runs:
            for c, p in r["points"].items():
                for k, v in p.get("funnel_batches", {}).items():
                    if k.startswith("batch_le_"):
                        hist.setdefault(c, {})[k] = hist.get(c, {}).get(k, 0) + v
        if hist:
            out[name]["batch_hist"] = hist
    return out


def report_suite(model: str, suite: str, backend: str, summary: dict, pairs, concurrency,
                 plots: dict[str, str]) -> str:
    lines = [f"## {suite_title(suite, backend)}", ""]
    ceilings = {name.split(":")[1]: v for name, v in summary.items() if name.startswith("ceiling:")}
    if ceilings:
        lines += ["In-process ceiling, no HTTP (items/s; predict = collate + run + postprocess on an "
                  "input preprocessed once; the last column preprocesses every item again):", "",
                  "| model implementation | batch 1 | batch 32 [min–max] | batch 32 incl. preprocessing | "
                  "other load (cores) |",
                  "|---|---|---|---|---|"]
        for impl, v in ceilings.items():
            lines.append(f"| {impl}: {v['description']} | {fmt(v['batch1'])} | {fmt(v['batch32'])} "
                         f"[{fmt(v['range32'][0])}–{fmt(v['range32'][1])}] | {fmt(v['batch32_pre'])} | "
                         f"{fmt(v['other_cores'], 2)} |")
        lines.append("")

    def ceiling_of(impl):
        return ceilings.get(impl, {}).get("batch32")

    lines += ["| system | clients | req/s [min–max] | p50 ms | p99 ms | non-2xx / socket err | "
              "vs ceiling b32 | vs best peer | CPU ms/req web | model | redis | Funnel mean batch | "
              "other load (cores) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in concurrency:
        peers = [summary[f"{s}:{i}"][c]["rps"] for s, i in pairs
                 if s in PEERS and c in summary.get(f"{s}:{i}", {})]
        best_peer = max(peers) if peers else None
        for system, impl in pairs:
            if system == "ceiling":
                continue
            point = summary.get(f"{system}:{impl}", {}).get(c)
            if not point:
                continue
            ceiling = ceiling_of(impl)
            cpu = point["cpu"]
            web = cpu.get("web")
            model_cpu = "in web" if system == "flask" else fmt(cpu.get("model"), 1)
            lo, hi = point["rps_range"]
            rng = f" [{lo:.0f}–{hi:.0f}]" if point["n"] > 1 else ""
            lines.append(
                f"| {LABELS[system]} ({impl}) | {c} | {point['rps']:.1f}{rng} | {fmt(point['p50_ms'], 1)} | "
                f"{fmt(point['p99_ms'], 1)} | {point['non2xx']} / {point['socket_errors']} | "
                f"{fmt(point['rps'] / ceiling if ceiling else None, 2)} | "
                f"{fmt(point['rps'] / best_peer if best_peer else None, 2)} | {fmt(web, 1)} | {model_cpu} | "
                f"{fmt(cpu.get('redis'), 2)} | {fmt(point['mean_batch'], 1)} | {point['other_cores']:.2f} |")
    lines.append("")
    funnel = summary.get(f"funnel:{'onnx' if suite == 'default' else backend}", {})
    sizes = funnel.get("batch_sample_c32")
    if sizes:
        lines.append(f"Funnel's batch sizes at 32 clients, from meta.batch_size of {len(sizes)} answers "
                     f"(request-weighted): median {med(sizes):.0f}, mean {statistics.mean(sizes):.1f}, "
                     f"min {min(sizes)}, max {max(sizes)}.")
    for c, hist in sorted(funnel.get("batch_hist", {}).items()):
        buckets = sorted(hist, key=lambda k: int(k.rsplit("_", 1)[1]))
        lines.append(f"Funnel's worker counters during the {c}-client runs (batches per size bucket): "
                     + ", ".join(f"≤{k.rsplit('_', 1)[1]}: {hist[k]:.0f}" for k in buckets if hist[k])
                     + ".")
    lines.append("")
    for title, file in plots.items():
        lines.append(f"![{title}]({file})")
    lines.append("")
    return "\n".join(lines)


def plot_suite(model: str, suite_label: str, summary: dict, pairs, concurrency, stem: str) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = {}
    servers = [(s, i) for s, i in pairs if s != "ceiling" and summary.get(f"{s}:{i}")]
    ceilings = [(i, summary[f"ceiling:{i}"]) for s, i in pairs
                if s == "ceiling" and f"ceiling:{i}" in summary]

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for system, impl in servers:
        points = summary[f"{system}:{impl}"]
        cs = [c for c in concurrency if c in points]
        rps = [points[c]["rps"] for c in cs]
        err = [[points[c]["rps"] - points[c]["rps_range"][0] for c in cs],
               [points[c]["rps_range"][1] - points[c]["rps"] for c in cs]]
        ax.errorbar(cs, rps, yerr=err, marker="o", capsize=3, label=f"{LABELS[system]} ({impl})")
    for n, (impl, v) in enumerate(ceilings):
        ax.axhline(v["batch32"], color="k", linestyle=["--", ":"][n % 2], linewidth=1,
                   label=f"ceiling {impl}, batch 32")
        ax.axhline(v["batch1"], color="grey", linestyle=["--", ":"][n % 2], linewidth=1,
                   label=f"ceiling {impl}, batch 1")
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrency, [str(c) for c in concurrency])
    ax.set_xlabel("concurrent clients (wrk connections)")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{model}: throughput ({suite_label})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    files["throughput"] = f"{stem}-throughput.png"
    fig.savefig(RESULTS / files["throughput"], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for key, ax in zip(("p50_ms", "p99_ms"), axes):
        for system, impl in servers:
            points = summary[f"{system}:{impl}"]
            cs = [c for c in concurrency if c in points]
            ax.plot(cs, [points[c][key] for c in cs], marker="o", label=f"{LABELS[system]} ({impl})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(concurrency, [str(c) for c in concurrency])
        ax.set_xlabel("concurrent clients")
        ax.set_title(f"{key[:3]} latency")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("ms")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{model}: latency ({suite_label})")
    fig.tight_layout()
    files["latency"] = f"{stem}-latency.png"
    fig.savefig(RESULTS / files["latency"], dpi=110)
    plt.close(fig)

    funnel = next((summary[f"funnel:{i}"] for s, i in pairs
                   if s == "funnel" and f"funnel:{i}" in summary), {})
    sizes, hist = funnel.get("batch_sample_c32"), funnel.get("batch_hist")
    if sizes or hist:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        if sizes:
            top = max(sizes)
            axes[0].hist(sizes, bins=range(1, top + 2), align="left", rwidth=0.85)
            axes[0].set_xlabel("batch size the answer rode in")
            axes[0].set_ylabel("answers")
            axes[0].set_title(f"meta.batch_size, 32 clients, {len(sizes)} answers")
        if hist:
            buckets = sorted({k for h in hist.values() for k in h}, key=lambda k: int(k.rsplit("_", 1)[1]))
            width = 0.8 / len(hist)
            for n, (c, h) in enumerate(sorted(hist.items())):
                total = sum(h.values()) or 1
                axes[1].bar([x + n * width for x in range(len(buckets))],
                            [100 * h.get(k, 0) / total for k in buckets], width, label=f"{c} clients")
            axes[1].set_xticks([x + 0.4 - width / 2 for x in range(len(buckets))],
                               [f"≤{k.rsplit('_', 1)[1]}" for k in buckets])
            axes[1].set_xlabel("batch size bucket")
            axes[1].set_ylabel("% of batches")
            axes[1].set_title("worker counters, per concurrency")
            axes[1].legend(fontsize=7)
        fig.suptitle(f"{model}: Funnel's batches ({suite_label})")
        fig.tight_layout()
        files["batches"] = f"{stem}-batches.png"
        fig.savefig(RESULTS / files["batches"], dpi=110)
        plt.close(fig)
    return files


# -- main --------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--suite", default="same", help="same, default, or both: same,default")
    parser.add_argument("--backend", default="onnx", choices=("onnx", "torch"),
                        help="backend of the 'same' suite")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--concurrency", default="1,8,32,128")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each wrk point")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds of wrk at 32 clients before measuring")
    parser.add_argument("--settle", type=float, default=4.0,
                        help="idle seconds before each point (and after it, for Funnel's counters)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the table gives medians and ranges")
    parser.add_argument("--batch-samples", type=int, default=400,
                        help="answers sampled at 32 clients for Funnel's batch-size distribution")
    parser.add_argument("--quick", action="store_true",
                        help="smoke check: 2 s per point, 1 and 32 clients, 1 round")
    parser.add_argument("--keep-logs", action="store_true", help="keep the systems' logs and wrk outputs")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda:N: where every system runs the model (peers, ceiling, Funnel)")
    parser.add_argument("--store", default=str(ROOT / "model_store"), help="model store of every system")
    parser.add_argument("--web-processes", type=int, default=None, metavar="N",
                        help="web processes of every system (gunicorn -w, LitServe num_api_servers, "
                             "FUNNEL_PROCESSES); default: each system's own (2, 2, 1, 2)")
    parser.add_argument("--funnel-env", action="append", default=[], metavar="FUNNEL_X=VALUE",
                        help="a setting for Funnel's web tier (repeatable), e.g. FUNNEL_REPLY_INBOX=1")
    args = parser.parse_args(argv)
    if any(not re.fullmatch(r"FUNNEL_[A-Z_]+=.*", kv) for kv in args.funnel_env):
        parser.error("--funnel-env takes FUNNEL_NAME=value")
    args.funnel_env = dict(kv.split("=", 1) for kv in args.funnel_env)
    if args.quick:
        args.duration, args.warmup, args.rounds, args.concurrency = 2.0, 2.0, 1, "1,32"
        args.batch_samples = min(args.batch_samples, 192)
    args.model_list = [m for m in args.models.split(",") if m]
    args.suites = [s for s in args.suite.split(",") if s]
    args.system_list = [s for s in args.systems.split(",") if s]
    args.concurrency_list = [int(c) for c in args.concurrency.split(",")]
    for name, values, known in (("model", args.model_list, MODELS),
                                ("suite", args.suites, ("same", "default")),
                                ("system", args.system_list, SYSTEMS)):
        unknown = [v for v in values if v not in known]
        if unknown:
            parser.error(f"unknown {name} {unknown}; known: {', '.join(known)}")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        parser.error(f"--device {args.device!r}: cpu or cuda:N")
    if args.web_processes is not None and args.web_processes < 1:
        parser.error("--web-processes must be at least 1")
    args.store = str(Path(args.store).resolve())
    onnx = sorted({f"{s}:{i}" for suite in args.suites for s, i in systems_of(suite, args.backend)
                   if i == "onnx" and s in args.system_list})
    if args.device != "cpu" and onnx and version("onnxruntime-gpu") == "not installed":
        parser.error(f"--device {args.device}: {', '.join(onnx)} would run ONNX on the GPU, but "
                     "onnxruntime-gpu is not installed (the default suite serves Funnel with ONNX): "
                     "use --suite same --backend torch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so that every system started so far is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now()
    command = "python benchmarks/bench.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    info = machine()
    info["gpu"] = gpu_name(args.device) if args.device != "cpu" else None
    if args.web_processes:
        LABELS["flask"] = f"Flask + gunicorn -w{args.web_processes}, no batching"
    workdir = Path(tempfile.mkdtemp(prefix="funnel-bench-"))
    log = open(workdir / "wrk.log", "a")
    jpeg = cat_jpeg()
    print(f"bench: {info['cpu']}, {info['cores']} cores; logs in {workdir}", flush=True)

    written = []
    ok = False
    try:
        for model in args.model_list:
            # rounds[r][suite_key][system:impl] = result of one run
            rounds: list[dict] = []
            plan = [(suite, pair) for suite in args.suites for pair in systems_of(suite, args.backend)
                    if pair[0] in args.system_list]
            distinct = {pair for _, pair in plan}
            servers = sum(1 for s, _ in distinct if s != "ceiling")
            estimate = args.rounds * (
                servers * (20 + args.warmup + len(args.concurrency_list) * (args.settle + args.duration + 1))
                + (len(distinct) - servers) * (10 + 3 * args.duration))
            print(f"{model}: {len(distinct)} systems x {args.rounds} round(s), about {estimate / 60:.0f} min",
                  flush=True)
            for r in range(args.rounds):
                # Rotate the order of the systems every round and reverse the concurrency sweep
                # every other round, so that slow drifts of the machine hit every system alike.
                order = plan[r % len(plan):] + plan[:r % len(plan)]
                conc = args.concurrency_list if r % 2 == 0 else args.concurrency_list[::-1]
                rounds.append({})
                for suite, (system, impl) in order:
                    key = f"{suite}"
                    name = f"{system}:{impl}"
                    if name in rounds[r].setdefault(key, {}):
                        continue
                    # A system run serves both suites when they name the same (system, impl).
                    shared = [s for s, p in plan if p == (system, impl)]
                    print(f"[{model} round {r + 1}/{args.rounds}] {LABELS[system]} ({impl}); "
                          f"load average {loadavg()}", flush=True)
                    data = payload(model, system, jpeg)
                    if system == "ceiling":
                        result = run_ceiling(model, impl, args, workdir, data, log)
                        print(f"    batch 1 {result['batch1']:.1f}, batch 32 {result['batch32']:.1f}, "
                              f"batch 32 with preprocessing {result['batch32_pre']:.1f} items/s", flush=True)
                    else:
                        result = run_system(system, model, impl, args, conc, workdir, data, log)
                    result["payload"] = data.kind
                    for s in shared:
                        rounds[r].setdefault(s, {})[name] = result
            written += write_report(model, args, info, command, stamp, rounds)
        ok = True
    finally:
        log.close()
        if ok and not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs kept in {workdir}", file=sys.stderr)
    for path in written:
        print(f"saved {path.relative_to(ROOT)}")
    return 0


def write_report(model: str, args, info: dict, command: str, stamp: dt.datetime,
                 rounds: list[dict]) -> list[Path]:
    tag = stamp.strftime("%Y%m%d-%H%M")
    base = f"bench-{model}-{tag}"
    pkgs = info["packages"]
    by_kind: dict[str, set[str]] = {}
    for r in rounds:
        for suite in r.values():
            for name, res in suite.items():
                if not name.startswith("ceiling:"):
                    by_kind.setdefault(res["payload"], set()).add(name.split(":")[0])
    payloads = [f"{kind} to {', '.join(sorted(systems))}" for kind, systems in sorted(by_kind.items())]
    web = args.web_processes
    accelerator = "cpu" if args.device == "cpu" else "cuda"
    parts = [
        f"# {model}: Funnel against its peers, {stamp:%Y-%m-%d %H:%M}", "",
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, {info['os']}; "
        f"onnxruntime {pkgs['onnxruntime']}, torch {pkgs['torch']}, transformers {pkgs['transformers']}, "
        f"numpy {pkgs['numpy']}, Pillow-SIMD {pkgs['pillow-simd']}; Flask {pkgs['flask']}, gunicorn "
        f"{pkgs['gunicorn']}, gevent {pkgs['gevent']}, service_streamer {pkgs['service_streamer']}, "
        f"litserve {pkgs['litserve']} (fastapi {pkgs['fastapi']}, uvicorn {pkgs['uvicorn']}); "
        f"{info['wrk']}.", "",
        f"Device: {args.device}" + (f" ({info['gpu']})" if info.get("gpu") else "")
        + f"; model store: {args.store}; web processes: "
        + (f"{web} for every system (--web-processes)." if web else "each system's default (below).")
        + (f" Funnel's web tier also had {', '.join(f'{k}={v}' for k, v in args.funnel_env.items())}."
           if args.funnel_env else ""), "",
        f"Command: `{command}`", "",
        *(["**Quick smoke run** (--quick: 2 s per point, one round): it shows that the harness works, "
           "not how the systems compare.", ""] if args.quick else []),
        f"Method: wrk -t1 -c<clients> -d{args.duration:g}s --timeout 30s --latency with a Lua script that "
        f"POSTs "
        f"the same body every time ({'; '.join(payloads)}); {args.warmup:g} s of wrk at 32 clients warm each "
        f"system up after it first answers correctly (checked: a 384-d normalised vector, or a cat class "
        f"first); before every point the driver waits until the system has worked off what the last run "
        f"left queued (its processes below 0.25 cores), then {args.settle:g} s more. {args.rounds} round(s): "
        f"within a round each "
        f"system is started, measured at every concurrency and stopped before the next starts; the order of "
        f"the systems rotates by one every round and the concurrency sweep is reversed every other round, so "
        f"that drifts in the machine's load hit every system alike. Figures are medians over rounds, "
        f"[min–max] of requests/s where there was more than one.", "",
        "Columns: *vs ceiling b32* divides by the in-process batch-32 rate of the same model implementation; "
        "*vs best peer* by the best of Flask, service-streamer and LitServe at the same concurrency. "
        "*CPU ms/req* is user+system CPU from /proc/<pid>/stat of each process tree over the measured "
        "run, divided by the requests answered: web = HTTP processes (gunicorn master and workers, "
        "LitServe's server and API processes), model = the model process(es) (Flask: inside the web "
        "workers), redis = the system's private redis-server. *other load* is the rest of the machine's "
        "busy CPU during the point (other jobs, the driver; wrk excluded) in cores: above ~0.1 the point "
        "was disturbed.", "",
        f"Settings: Flask: gunicorn -w {web or 2} sync workers, 1 intra-op thread each, no batching. "
        f"service-streamer: RedisStreamer in gunicorn -k gevent -w {web or 2}, run_redis_workers_forever "
        "with 1 model worker, batch 32, max latency 20 ms, its own redis-server; preprocessing in the web "
        "processes (suite 'default': raw inputs to the model worker, as its examples do). LitServe: "
        f"max_batch_size 32, batch_timeout 0.02 s, one inference worker (accelerator {accelerator}), "
        + (f"num_api_servers={web}" if web else "one API server (its default)")
        + ", preprocessing in decode_request (inference worker). Funnel: scripts.stack.Stack "
        f"with default settings ({web or 2} gthread web processes × 64 threads, one worker for this model, "
        "batch size from model.json, linger 5 ms, library-default intra-op threads). Peers' model processes "
        "and the ceiling use the library's default intra-op threads.", "",
    ]
    written = []
    raw = {"model": model, "command": command, "machine": info, "date": stamp.isoformat(), "rounds": rounds,
           "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, list))}}
    for suite in args.suites:
        pairs = [p for p in systems_of(suite, args.backend) if p[0] in args.system_list]
        summary = summarize(rounds, suite, pairs, args.concurrency_list)
        label = f"same-{args.backend}" if suite == "same" else "default"
        try:
            plots = plot_suite(model, label, summary, pairs, args.concurrency_list, f"{base}-{label}")
        except ImportError as exc:  # matplotlib missing: the table still counts
            print(f"no plots: {exc}", file=sys.stderr)
            plots = {}
        parts.append(report_suite(model, suite, args.backend, summary, pairs, args.concurrency_list, plots))
        written += [RESULTS / f for f in plots.values()]
    md_path = RESULTS / f"{base}.md"
    md_path.write_text("\n".join(parts))
    json_path = RESULTS / f"{base}.json"
    json_path.write_text(json.dumps(raw, indent=1, default=str))
    print("\n".join(parts))
    return [md_path, json_path, *written]


if __name__ == "__main__":
    sys.exit(main())
