"""What one request costs Redis, and the request rate at which one Redis core is saturated.

    python -m benchmarks.redis_budget [--requests 2000] [--clients 1,32] [--models text-embedding,image-classifier]

Starts the stack as `funnel up` does (without the front door: Redis is what is
measured), resets Redis' statistics (CONFIG RESETSTAT), sends the requests from
a pool of client threads, then reads INFO commandstats (calls per command),
INFO stats (bytes in and out) and the redis-server process's CPU time from
/proc. Per request: commands, µs of Redis CPU (command time plus event loop,
networking and the workers' idle polling, all of it), bytes; and 1 s of CPU /
µs per request = the request rate one Redis core can carry. The table goes to
benchmarks/results/redis-budget-<date>.md with the machine it ran on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis

from benchmarks import save
from benchmarks.cpu import CLK_TCK, _stat
from benchmarks.machine import cpu_model
from benchmarks.payloads import cat_jpeg
from funnel.common.link.connection import connect
from funnel.scripts.stack import Stack
from funnel_client import Client

SENTENCE = "A man is eating food on a sunny afternoon in the park."


def redis_cpu_s(pid: int) -> float:
    stat = _stat(pid)
    return stat[1] / CLK_TCK if stat else 0.0


def command_stats(client: redis.Redis) -> dict[str, tuple[int, float]]:
    """command -> (calls, µs inside it) since the last CONFIG RESETSTAT (a script's inner commands count
    in both the script's and their own)."""
    out = {}
    for name, values in client.info("commandstats").items():
        out[name.removeprefix("cmdstat_")] = (int(values["calls"]), float(values["usec"]))
    return out


def send(url: str, model: str, requests: int, clients: int) -> float:
    """Seconds taken to get `requests` answers from `clients` concurrent threads."""
    image = cat_jpeg() if model == "image-classifier" else None
    local = threading.local()

    def one(_):
        if not hasattr(local, "client"):
            local.client = Client(url, retries=10)
        if image is not None:
            local.client.predict(model, image=image)
        else:
            local.client.predict(model, text=SENTENCE)

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))
    return time.monotonic() - started


def measure(stack: Stack, model: str, requests: int, clients: int) -> dict:
    client = connect(stack.redis_url, socket_timeout=10)
    send(stack.url, model, min(200, requests), clients)  # warm up: workers' cost fits, pools, caches
    client.config_resetstat()
    cpu_before, net_before = redis_cpu_s(stack.redis.process.pid), client.info("stats")
    seconds = send(stack.url, model, requests, clients)
    cpu = redis_cpu_s(stack.redis.process.pid) - cpu_before
    stats, net = command_stats(client), client.info("stats")
    calls = sum(c for c, _ in stats.values())
    bytes_in = net["total_net_input_bytes"] - net_before["total_net_input_bytes"]
    bytes_out = net["total_net_output_bytes"] - net_before["total_net_output_bytes"]
    per = {name: c / requests for name, (c, _) in sorted(stats.items(), key=lambda kv: -kv[1][0])}
    return {"model": model, "clients": clients, "requests": requests, "rate": requests / seconds,
            "commands": calls / requests, "cpu_us": cpu * 1e6 / requests,
            "bytes_in": bytes_in / requests, "bytes_out": bytes_out / requests, "per_command": per}


def table(rows: list[dict]) -> str:
    lines = ["| model | clients | req/s (this run) | commands/req | µs Redis CPU/req "
             "| bytes in/req | bytes out/req | one Redis core saturates at (req/s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['clients']} | {r['rate']:.0f} | {r['commands']:.2f} | "
                     f"{r['cpu_us']:.1f} | {r['bytes_in']:.0f} | {r['bytes_out']:.0f} | {1e6 / r['cpu_us']:,.0f} |")
    lines += ["", "Commands per request, by command (those a Lua script runs count too: the push script's",
              "LLEN and LPUSH, the take script's RPOP; at 1 client most are the idle worker's polling):", ""]
    for r in rows:
        top = ", ".join(f"{name} {n:.2f}" for name, n in list(r["per_command"].items())[:10])
        lines.append(f"- {r['model']}, {r['clients']} clients: {top}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_budget", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", default="1,32")
    parser.add_argument("--models", default="text-embedding,image-classifier")
    parser.add_argument("--store", default="model_store")
    args = parser.parse_args(argv)
    rows = []
    with Stack(model_store=args.store, models=args.models.split(",")) as stack:
        for model in args.models.split(","):
            for clients in map(int, args.clients.split(",")):
                rows.append(measure(stack, model, args.requests, clients))
                print(table(rows[-1:]).split("\n")[2], flush=True)
    report = (f"# Redis cost per request, {dt.datetime.now():%Y-%m-%d %H:%M}\n\n"
              f"Machine: {cpu_model()}, {os.cpu_count()} cores; `python -m benchmarks.redis_budget "
              f"--requests {args.requests} --clients {args.clients} --models {args.models}`\n\n{table(rows)}\n")
    save("redis-budget", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
