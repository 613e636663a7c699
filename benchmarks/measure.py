"""One system, one round: start it, warm it up, measure every concurrency with wrk and the CPU its
processes used, stop it. The ceiling instead runs once in a child process and reports items/s."""

from __future__ import annotations

import json
import re
import resource
import shlex
import subprocess
import time
from pathlib import Path

from benchmarks import ROOT
from benchmarks.cpu import cpu_seconds, cpu_ticks, machine_busy_s
from benchmarks.load import sample_batch_sizes, write_lua, wrk
from benchmarks.machine import loadavg
from benchmarks.payloads import Payload
from benchmarks.systems import STARTERS, Running, peer, peer_env, wait_ready
from funnel.scripts.stack import Stack


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


def funnel_counters(stack: Stack, model: str) -> dict[str, float]:
    """Summed counters (batches, items, batch_le_<n>) of this model's workers, from their registry hashes."""
    from funnel.common.link.connection import connect

    client = connect(stack.redis_url, socket_timeout=10)
    try:
        totals: dict[str, float] = {}
        for worker_id, served in client.hgetall("funnel:workers").items():
            if served.decode() != model:
                continue
            for name, value in client.hgetall(f"funnel:worker:{{{model}}}:{worker_id.decode()}").items():
                name = name.decode()
                if name in ("batches", "items") or name.startswith("batch_le_"):
                    totals[name] = totals.get(name, 0) + float(value)
        return totals
    finally:
        client.close()


def run_ceiling(model: str, impl: str, options, workdir: Path, data: Payload, log) -> dict:
    raw = workdir / f"ceiling-{model}.raw"
    raw.write_bytes(data.body)
    env = peer_env(model, impl, options, {})
    args = peer("ceiling", f"{options.duration:g}", str(raw))
    busy_before, child_before = machine_busy_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    child_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (child_after.ru_utime - child_before.ru_utime + child_after.ru_stime - child_before.ru_stime)
    log.write(f"$ BENCH_IMPL={impl} {shlex.join(args)}\n{proc.stdout}{proc.stderr[-2000:]}\n")
    found = re.search(r"^CEILING (.*)$", proc.stdout, re.MULTILINE)
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
        warm = min(32, max(concurrency))  # 32, or fewer where no point has more (requests of many texts)
        wrk(running.url, script, warm, args.warmup, log)  # warm-up, not recorded
        for c in concurrency:
            point = measure_point(running, system, model, c, script, args, log)
            result["points"][c] = point
            print(f"    c={c:<4} {point['rps']:8.1f} req/s  p50 {point['p50_ms']:7.1f} ms  "
                  f"p99 {point['p99_ms']:7.1f} ms  non-2xx {point['non2xx']}  socket errors "
                  f"{point['socket_errors']}  other load {point['other_cores']:.2f} cores"
                  + (f"  mean batch {point['mean_batch']:.1f}" if "mean_batch" in point else ""),
                  flush=True)
        if running.stack:
            drain(running)
            samples = max(warm, args.batch_samples // getattr(args, "texts", 1))  # requests of many texts: fewer
            sizes = sample_batch_sizes(running.url, data, warm, samples)
            result["batch_sample_c32"] = sizes
        result["loadavg_after"] = loadavg()
        return result
    finally:
        running.stop()


def measure_point(running: Running, system: str, model: str, c: int, script: Path, args, log) -> dict:
    """One wrk run at c clients on a drained, settled system, with the CPU every party used meanwhile."""
    drained = drain(running)
    if drained > 5:
        print(f"    (waited {drained:.0f} s for the last run's queued requests)", flush=True)
    time.sleep(args.settle)  # idle between points, for every system alike
    counters = funnel_counters(running.stack, running.served or model) if running.stack else None
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
        later = funnel_counters(running.stack, running.served or model)
        delta = {k: later.get(k, 0) - counters.get(k, 0) for k in later}
        point["funnel_batches"] = delta
        if delta.get("batches"):
            point["mean_batch"] = delta["items"] / delta["batches"]
    return point
