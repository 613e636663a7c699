"""Triton's perf_analyzer against wrk on the same route, the same sentence and the same concurrency.

    python -m benchmarks.perf_analyzer [--concurrency 1,9,17,25] [--duration 8] [--rounds 2]

One stack (what `funnel up` starts for text-embedding, with funnel-grpc). At each concurrency, in turn:
wrk POSTing /v2/models/text-embedding/infer (the JSON body of one sentence), perf_analyzer over HTTP on
the same route with that sentence as its input data (`--input-data`), and perf_analyzer over gRPC, with
and without `--streaming`. Each tool's requests/s over `--duration` seconds (perf_analyzer: three
windows of a third of it, `--stability-percentage 1000`, whatever they vary), median over rounds, the
tools' order rotating. Saved under benchmarks/results/perf-analyzer-<date>.md with the machine. perf_analyzer is the one
scripts/install.sh puts in .venv/perf_analyzer/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import RESULTS, ROOT
from benchmarks.core import SENTENCE, V2_BODY, wrk
from benchmarks.machine import machine
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack

MODEL = "text-embedding"
PERF = ROOT / ".venv" / "perf_analyzer"
TOOLS = ("wrk http", "perf_analyzer http", "perf_analyzer grpc", "perf_analyzer grpc --streaming")


def perf_analyzer(url: str, protocol: str, streaming: bool, clients: int, seconds: float, data: Path) -> float:
    env = {**os.environ, "LD_LIBRARY_PATH": f"{PERF / 'nvidia' / 'cuda_runtime' / 'lib'}:"
                                            f"{os.environ.get('LD_LIBRARY_PATH', '')}"}
    run = subprocess.run([str(PERF / "bin" / "perf_analyzer"), "-m", MODEL, "-u", url, "-i", protocol,
                          *(["--streaming"] if streaming else []), "--concurrency-range", f"{clients}:{clients}",
                          "--shared-memory", "none", "--input-data", str(data), "--measurement-interval",
                          str(int(seconds * 1000 / 3)), "--stability-percentage", "1000", "--max-trials", "3"],
                         capture_output=True, text=True, env=env, timeout=600)
    found = re.search(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec", run.stdout)
    if run.returncode != 0 or not found:
        raise RuntimeError(f"perf_analyzer failed: {run.stdout[-1500:]} {run.stderr[-1500:]}")
    return float(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.perf_analyzer", description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,9,17,25")
    parser.add_argument("--duration", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="perf-analyzer-"))
    data = work / "input.json"
    data.write_text(json.dumps({"data": [{"TEXT": {"content": [SENTENCE], "shape": [1]}}]}))
    runs: dict[str, dict[int, list[float]]] = {tool: {c: [] for c in levels} for tool in TOOLS}
    with Stack(model_store=ROOT / "model_store", models=[MODEL], grpc_port=free_port(),
               workers_per_model=None, log_dir=work / "stack") as stack:
        http_url, grpc_url = stack.url.removeprefix("http://"), f"127.0.0.1:{stack.grpc_port}"
        wrk(f"{stack.url}/v2/models/{MODEL}/infer", 32, 5, V2_BODY)  # warm
        for round_ in range(args.rounds):
            for c in levels:
                for tool in TOOLS[round_ % len(TOOLS):] + TOOLS[:round_ % len(TOOLS)]:
                    if tool == "wrk http":
                        rps = wrk(f"{stack.url}/v2/models/{MODEL}/infer", c, int(args.duration), V2_BODY)["rps"]
                    else:
                        protocol = tool.split()[1]
                        rps = perf_analyzer(http_url if protocol == "http" else grpc_url, protocol,
                                            tool.endswith("--streaming"), c, args.duration, data)
                    runs[tool][c].append(rps)
                    print(f"round {round_ + 1} c={c} {tool}: {rps:.1f} req/s", flush=True)
    median = {tool: {c: statistics.median(v) for c, v in by_c.items()} for tool, by_c in runs.items()}
    when = dt.datetime.now(dt.UTC)
    info = machine()
    command = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# perf_analyzer against wrk, {when:%Y-%m-%d %H:%M}", "",
             f"Machine: {info['cpu']}, {info['cores']} cores. Command: `python -m benchmarks.perf_analyzer {command}`.",
             "", f"text-embedding, one sentence a request, {args.duration:g} s a point, {args.rounds} rounds "
             "(median; each round's figure in brackets); the ratio is perf_analyzer's over wrk's on /v2 over HTTP.", "",
             "| clients | " + " | ".join(TOOLS) + " | perf_analyzer http / wrk |", "|" + " --- |" * (len(TOOLS) + 2)]
    for c in levels:
        cells = [f"{median[t][c]:.1f} {[round(x, 1) for x in runs[t][c]]}" for t in TOOLS]
        ratio = median["perf_analyzer http"][c] / median["wrk http"][c]
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    path = RESULTS / f"perf-analyzer-{when:%Y%m%d-%H%M}.md"
    raw = json.dumps({"machine": info, "runs": runs}, indent=1)
    path.write_text("\n".join(lines) + "\n\n```json\n" + raw + "\n```\n")
    print(path)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
