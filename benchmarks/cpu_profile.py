"""Where a request's CPU goes: each process and thread of a Funnel stack under load, and a profile of each.

    python -m benchmarks.cpu_profile [--model image-classifier] [--clients 1,32] [--duration 20]
                                     [--workers 1] [--env FUNNEL_X=value ...] [--profile] [--top 25] [--ceiling]

Starts the stack `funnel up` starts (benchmarks/systems.py's Funnel, this model only; --workers and
--env change it as a user would), warms it with wrk at 32 clients, then drives it with wrk (the
bench's body: one sentence or the cat JPEG) and reads from /proc the CPU of every process over the
run: each web process, Redis, and each of the worker's threads by name (the run thread is
MainThread, `take` and `reply` the pipeline's others; unnamed ones are ONNX Runtime's pool), per
request. With --profile every Python thread of the stack also runs under cProfile timed by its own
thread's CPU (benchmarks/profiling/sitecustomize.py; profiling slows the Python in it, so take the
CPU figures from a run without it), and the functions with the most CPU of the worker and of the web
processes over the load alone are printed, and kept under benchmarks/results/profile-<model>-<date>/
(worker-<clients>.prof, web-<clients>.prof: `python -m pstats` reads them). --ceiling first runs the
model in this process, on one thread and on all the cores, for the CPU an item costs it there.
"""

from __future__ import annotations

import argparse
import io
import marshal
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks import ROOT
from benchmarks.cpu import CLK_TCK, machine_busy_s
from benchmarks.load import write_lua, wrk
from benchmarks.measure import drain, funnel_counters
from benchmarks.payloads import MODELS, SENTENCE, cat_jpeg, payload
from funnel.scripts.stack import Stack

PROFILER = ROOT / "benchmarks" / "profiling"


def thread_ticks(pid: int) -> dict[int, int]:
    """CPU ticks so far of each thread of a process."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        out[int(tid)] = int(fields[11]) + int(fields[12])
    return out


def process_ticks(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def web_pids(root: int) -> list[int]:
    return [root, *(int(p) for p in Path(f"/proc/{root}/task/{root}/children").read_text().split())]


def thread_names(folder: Path, pid: int) -> dict[int, str]:
    names = {pid: "MainThread"}
    path = folder / f"{pid}.threads"
    if path.exists():
        for line in path.read_text().splitlines():
            tid, _, name = line.partition(" ")
            names[int(tid)] = name
    return names


def snapshot(stack: Stack) -> dict:
    return {"web": {pid: process_ticks(pid) for pid in web_pids(stack.web.pid)},
            "redis": process_ticks(stack.redis.process.pid),
            "workers": {w.pid: thread_ticks(w.pid) for w in stack.workers}}


def report(before: dict, after: dict, requests: int, names: dict[int, dict[int, str]]) -> list[str]:
    per = 1000 / CLK_TCK / max(1, requests)  # ticks -> ms a request
    lines = ["| process / thread | CPU ms/request |", "| --- | --- |"]
    web = {pid: ticks - before["web"].get(pid, 0) for pid, ticks in after["web"].items()}
    lines.append(f"| web, all processes | {sum(web.values()) * per:.3f} |")
    lines += [f"| web process {pid} | {ticks * per:.3f} |" for pid, ticks in web.items() if ticks]
    lines.append(f"| Redis | {(after['redis'] - before['redis']) * per:.3f} |")
    workers = sum(ticks - before["workers"][pid].get(tid, 0) for pid, threads in after["workers"].items()
                  for tid, ticks in threads.items())
    lines.append(f"| workers, all | {workers * per:.3f} |")
    for pid, threads in after["workers"].items():
        used = {tid: ticks - before["workers"][pid].get(tid, 0) for tid, ticks in threads.items()}
        lines.append(f"| worker {pid}, all threads | {sum(used.values()) * per:.3f} |")
        lines += [f"| worker {pid}: {names.get(pid, {}).get(tid, 'library thread ' + str(tid))} | {ticks * per:.3f} |"
                  for tid, ticks in sorted(used.items(), key=lambda kv: -kv[1]) if ticks]
    return lines


def snapshots(folder: Path, k: int, pids: list[int], timeout_s: float = 30.0) -> None:
    """Ask every profiled process for snapshot k, and wait for theirs."""
    (folder / f"snap-{k}").touch()
    deadline = time.monotonic() + timeout_s
    while not all((folder / f"{pid}.{k}.prof").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def window(folder: Path, pid: int, point: int) -> dict:
    """A process's stats over one point's load (between its two snapshots)."""
    first, last = (marshal.loads((folder / f"{pid}.{k}.prof").read_bytes()) for k in (2 * point, 2 * point + 1))
    out = {}
    for func, (cc, nc, tt, ct, _) in last.items():
        was = first.get(func, (0, 0, 0.0, 0.0, {}))
        if nc - was[1]:
            out[func] = (cc - was[0], nc - was[1], tt - was[2], ct - was[3], {})
    return out


def top(stats_list: list[dict], count: int, out_file: Path) -> str:
    """The functions with the most CPU of these processes' windows, added; written to out_file."""
    total: dict = {}
    for stats in stats_list:
        for func, row in stats.items():
            was = total.get(func, (0, 0, 0.0, 0.0, {}))
            total[func] = (was[0] + row[0], was[1] + row[1], was[2] + row[2], was[3] + row[3], {})
    out_file.write_bytes(marshal.dumps(total))
    text = io.StringIO()
    pstats.Stats(str(out_file), stream=text).sort_stats("tottime").print_stats(count)
    return text.getvalue()


def ceiling(model: str, seconds: float = 3.0) -> list[str]:
    """The model in this process, on inputs preprocessed once: CPU ms per item (every thread of the
    process, from /proc) and items/s, at batch 1 and at the model's batch size, on one thread and on
    the library's (all the cores), as the worker runs it: collate and run."""
    from funnel.common import tasks
    from funnel.common.store import load_spec
    from funnel.common.tasks.base import split
    from funnel.worker import backend as backends

    spec = load_spec(ROOT / "model_store", model)
    task = tasks.load(spec)
    raw = cat_jpeg() if model == "image-classifier" else SENTENCE
    item = split(task.preprocess(raw))[0]
    lines = ["| in process | batch | items/s | CPU ms/item |", "| --- | --- | --- | --- |"]
    for threads in (1, 0):
        session = backends.OnnxBackend(spec, "cpu", threads)
        for size in (1, spec.batch_size):
            feeds = task.collate([item] * size)
            session.run(feeds)
            done, cpu, started = 0, process_ticks(os.getpid()), time.perf_counter()
            while time.perf_counter() - started < seconds:
                session.run(task.collate([item] * size))
                done += size
            wall, used = time.perf_counter() - started, (process_ticks(os.getpid()) - cpu) / CLK_TCK
            lines.append(f"| {threads or 'all the cores'} thread{'s' * (threads != 1)} | {size} | "
                         f"{done / wall:.1f} | {used * 1000 / done:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="image-classifier", choices=MODELS)
    parser.add_argument("--clients", default="32", help="wrk's connections at each point, e.g. 1,32")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1, help="workers for the model (funnel up --workers-per-model)")
    parser.add_argument("--env", action="append", default=[], metavar="FUNNEL_X=VALUE",
                        help="a setting for the stack's web tier and workers (repeatable)")
    parser.add_argument("--profile", action="store_true", help="cProfile every Python thread (slower)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--ceiling", action="store_true",
                        help="first, the model in process: CPU per item at batch 1 and at its batch size, "
                             "on 1 thread and on all the cores")
    args = parser.parse_args(argv)
    if args.ceiling:
        print("\n".join(ceiling(args.model)), flush=True)
    env = dict(kv.split("=", 1) for kv in args.env)
    folder = Path(tempfile.mkdtemp(prefix="funnel-profile-"))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROFILER), os.environ.get("PYTHONPATH")]))
    os.environ["BENCH_PROFILE_DIR"] = str(folder)  # the threads' names, and with --profile their profiles
    os.environ["BENCH_PROFILE"] = "1" if args.profile else "0"
    data = payload(args.model, "funnel", cat_jpeg())
    stack = Stack(models=[args.model], model_store=ROOT / "model_store", log_dir=folder / "logs",
                  web_env=env, worker_env=env, workers_per_model=args.workers)
    stack.start(timeout_s=240)
    url = f"{stack.url}/v1/models/{args.model}/predict"
    points = []
    try:
        script = write_lua(folder, "load", data)
        log = open(folder / "wrk.log", "w")
        wrk(url, script, 32, args.warmup, log)
        profiled = [*web_pids(stack.web.pid)[1:], *(w.pid for w in stack.workers)] if args.profile else []
        names = {w.pid: thread_names(folder, w.pid) for w in stack.workers}
        for i, clients in enumerate(int(c) for c in args.clients.split(",")):
            drain(SimpleNamespace(groups={"web": [stack.web.pid], "model": [w.pid for w in stack.workers],
                                          "redis": [stack.redis.process.pid]}))  # type: ignore[arg-type]
            snapshots(folder, 2 * i, profiled)
            before, busy, counted = snapshot(stack), machine_busy_s(), funnel_counters(stack, args.model)
            result = wrk(url, script, clients, args.duration, log)
            after, busy = snapshot(stack), machine_busy_s() - busy
            counts = {k: v - counted.get(k, 0) for k, v in funnel_counters(stack, args.model).items()}
            snapshots(folder, 2 * i + 1, profiled)
            points.append((clients, result, before, after, busy, counts))
    finally:
        stack.stop()
    out = ROOT / "benchmarks" / "results" / f"profile-{args.model}-{time.strftime('%Y%m%d-%H%M')}"
    for i, (clients, result, before, after, busy, counts) in enumerate(points):
        lines = [f"### {args.model}, {clients} clients, {args.workers} worker(s), env {env or 'defaults'}"
                 f"{', profiled' if args.profile else ''}: {result['rps']:.1f} req/s, p50 {result['p50_ms']:.1f} ms, "
                 f"p99 {result['p99_ms']:.1f} ms, non-2xx {result['non2xx']}, mean batch "
                 f"{counts.get('items', 0) / max(1, counts.get('batches', 0)):.1f}, machine busy "
                 f"{busy / result['seconds']:.2f} cores", "", *report(before, after, result["requests"], names)]
        print("\n".join(lines), flush=True)
        if args.profile:
            out.mkdir(parents=True, exist_ok=True)
            workers = [w.pid for w in stack.workers]
            webs = [pid for pid in profiled if pid not in workers]
            print(f"\n#### worker (all threads)\n"
                  f"{top([window(folder, p, i) for p in workers], args.top, out / f'worker-{clients}.prof')}"
                  f"\n#### web processes\n"
                  f"{top([window(folder, p, i) for p in webs], args.top, out / f'web-{clients}.prof')}")
    if args.profile:
        print(f"profiles kept in {out.relative_to(ROOT)}")
    if not os.environ.get("BENCH_KEEP"):
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
