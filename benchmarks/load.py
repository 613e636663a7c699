"""Load generators: wrk with a Lua script POSTing one body (and its parsed summary), and a small
Python client that samples Funnel's meta.batch_size."""

from __future__ import annotations

import http.client
import json
import re
import shlex
import subprocess
import threading
from pathlib import Path

from benchmarks.payloads import Payload

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
    proc = subprocess.run(args, check=False, capture_output=True, text=True, timeout=duration_s + 90)
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
