"""The web tier's CPU per request, A/B: web settings side by side in one interleaved run.

    python -m benchmarks.web_cpu [--rounds 3] [--duration 10] [--clients 32] \
        [--clients 32,128,512] [--variant NAME=FUNNEL_X=1,FUNNEL_Y=2 ...]

Each variant is a stack (private Redis, the web tier, one text-embedding
worker) started with its own FUNNEL_* settings (both tiers get them: each takes
what it declares, so a variant can change the worker too; WORKERS=N starts N
workers for the model instead of one; ROUTE=v2 sends the same sentence to
/v2/models/text-embedding/infer instead of /v1's predict, ROUTE=openai to
/v1/embeddings (base64, as OpenAI's client asks), ROUTE=grpc to the gRPC
service's ModelInfer in raw_input_contents (funnel-grpc, loaded by
benchmarks/grpc_load.py instead of wrk; its CPU is then the "web" column);
ITEMS=N sends N copies of the sentence in each request; PYTHONPATH=<a
checkout's link tree> runs another version of Funnel; COMMIT=<rev> runs a commit
of this repository, exported with `git archive` into a temporary folder (both
tiers: its web tier with its own worker, whose wire and scripts match);
SNAPSHOT=1 runs this working tree as it was when the run started (steady while
others edit it); HOOKS=stripped takes the web tier's tracing calls out of that
code's web/pipeline.py, the working tree's when neither is given (`strip_spans`:
the build the no-op path is measured against); OTLP=sink turns tracing on,
exporting to a sink in this process that reads and drops every OTLP/HTTP
export), or, named `bare...`,
the floor: an ASGI app that parses the JSON and answers a constant under the
same gunicorn settings (benchmarks/peers/bare_asgi.py); every round starts each
variant in turn (the order rotating), warms it, runs wrk with one sentence
per POST at each number of clients, and reads the CPU seconds of the web processes (gunicorn master and
workers, or funnel-grpc), the worker and Redis from /proc over the run. Throughput and CPU are per item
(a sentence: one per request but with ITEMS). Prints medians over rounds and saves the table under
benchmarks/results/ with the machine. Each variant's web CPU is also given
against the baseline's (--baseline, the first variant unless named) round by
round, its ratio to the baseline's run of the same round: the median of those
ratios and their range, drift of the machine between rounds cancelling
(--baseline is repeatable: a column each).
--max-other CORES runs a variant again (up to LOAD_RETRIES times) when the rest
of the machine used more than that meanwhile (a shared machine's bursts).
--hook-cost adds, in process, what the tracing calls of one /v1 predict cost
with tracing off (the no-op path of common/observability/tracing.py).

    python -m benchmarks.web_cpu --variant v1= --variant v2=ROUTE=v2 --variant openai=ROUTE=openai \
        --variant grpc=ROUTE=grpc     # the four doors to the same model, in one run
    python -m benchmarks.web_cpu --rounds 8 --duration 8 --variant off=SNAPSHOT=1 --variant stripped=HOOKS=stripped \
        --variant before=COMMIT=1cd4d1c --variant on=SNAPSHOT=1,OTLP=sink --baseline before \
        --baseline stripped --hook-cost --max-other 0.15     # tracing's cost, off and on
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks import ROOT, save
from benchmarks.core import BODY, SENTENCE, V2_BODY, in_process_ceiling, machine, wrk
from benchmarks.cpu import cpu_seconds, cpu_ticks, machine_busy_s
from benchmarks.systems import gunicorn
from funnel.common import settings as loader
from funnel.common.observability import tracing
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from funnel.web.settings import WebSettings
from tests.support import http

MODEL = "text-embedding"
DEFAULT_VARIANTS = ["defaults="]
# Each HTTP route's path, and its body for n copies of the same sentence, in each protocol's request.
ROUTES = {
    "v1": (f"/v1/models/{MODEL}/predict", lambda n: BODY if n == 1 else json.dumps({"texts": [SENTENCE] * n})),
    "v2": (f"/v2/models/{MODEL}/infer", lambda n: V2_BODY if n == 1 else json.dumps(
        {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [n], "data": [SENTENCE] * n}]})),
    "openai": ("/v1/embeddings", lambda n: json.dumps({"model": MODEL, "input": SENTENCE if n == 1 else [SENTENCE] * n,
                                                       "encoding_format": "base64"})),
}
# The variant's own options, not settings.
BENCH_ONLY = ("ROUTE", "WORKERS", "ITEMS", "COMMIT", "SNAPSHOT", "HOOKS", "OTLP")
LOAD_RETRIES = 3  # --max-other's tries of a run beyond the first


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, settings = text.partition("=")
    env = dict(pair.split("=", 1) for pair in settings.split(",") if pair)
    return name, env


@contextlib.contextmanager
def bare(env: dict[str, str]):
    """The bare app under the gunicorn settings Funnel's web tier would take from env."""
    settings = loader.load(WebSettings, [], environ=env)
    port = free_port()
    command = gunicorn("benchmarks.peers.bare_asgi:app", port, settings.process_count(),
                       ["-k", "funnel.web.transport.protocol.Worker"])
    web = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", web=web, workers=[], redis=None)
    finally:
        web.terminate()
        web.wait(10)


def code(into: Path, commit: str | None, hooks: bool = True) -> str:
    """A commit of this repository (`git archive`), or this working tree's packages as they are now
    (commit None), copied into `into`, and a PYTHONPATH entry that imports it as `funnel`: a folder
    of links laid out as its pyproject.toml's package-dir maps the folders (the editable install
    maps them to this checkout's, and a path entry is searched first). Without hooks, its
    web/pipeline.py's tracing calls are taken out (strip_spans)."""
    source, links = into / "src", into / "pp" / "funnel"
    source.mkdir(parents=True)
    links.mkdir(parents=True)
    if commit is not None:
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    pyproject = (source if commit is not None else ROOT) / "pyproject.toml"
    for name, folder in tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"].items():
        if commit is None:
            shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
        if name == "funnel":  # the package's own modules (sdk/): each linked into funnel/
            for entry in (source / folder).iterdir():
                (links / entry.name).symlink_to(entry)
        elif name.count(".") == 1:  # funnel.web and its siblings; deeper packages are inside them
            (links / name.split(".")[1]).symlink_to(source / folder)
    if not hooks:
        pipeline = source / "web" / "pipeline.py"
        pipeline.write_text(strip_spans(pipeline.read_text()))
    return str(links.parent)


def _traced(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "trace"


def _mark(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and _traced(node.value)


def _spans_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "spans"
            and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id == "self")


def _entered(expr: ast.AST) -> bool:
    """`trace`, or `trace or <a no-op>` (code before the no-op trace)."""
    return _traced(expr) or (isinstance(expr, ast.BoolOp) and _traced(expr.values[0]))


def _hook(node: ast.AST) -> bool:
    return (_spans_call(node) or _mark(node) or (isinstance(node, ast.With) and _entered(node.items[0].context_expr))
            or (isinstance(node, (ast.If, ast.IfExp)) and _traced(node.test))
            or (isinstance(node, ast.BoolOp) and _traced(node.values[0])))


class _Strip(ast.NodeTransformer):
    def visit_With(self, node: ast.With) -> Any:
        self.generic_visit(node)
        return node.body if len(node.items) == 1 and _entered(node.items[0].context_expr) else node

    def visit_If(self, node: ast.If) -> Any:
        return ast.Pass() if _traced(node.test) and not node.orelse else self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.orelse) if _traced(node.test) else self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> Any:
        call = node.value
        return ast.Pass() if isinstance(call, ast.Call) and _mark(call.func) else self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        return ast.Constant("") if _mark(node) else self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> Any:
        return ast.Constant(None) if _spans_call(node) else self.generic_visit(node)


def strip_spans(code: str) -> str:
    """A module's source without its tracing: `trace = self.spans.request(...)` made `trace = None`,
    each `with trace:` (or, in code before the no-op trace, `with trace or ...:`) replaced by its
    body, each `trace.step(...)` or `trace.annotate(...)` and each `if trace:` (no else) by `pass`,
    each `trace.traceparent` and `x if trace else y` by "" and y (what they are when off).
    SystemExit if a hook is left (one of a shape this does not know)."""
    tree = ast.fix_missing_locations(_Strip().visit(ast.parse(code)))
    left = [getattr(n, "lineno", 0) for n in ast.walk(tree) if _hook(n)]
    if left:
        raise SystemExit(f"strip_spans: tracing calls of an unknown shape left at lines {left}")
    return ast.unparse(tree)


class Sink:
    """An OTLP/HTTP endpoint on 127.0.0.1 that reads and drops every export, counting them (a
    collector's cost is not the web tier's)."""

    def __init__(self) -> None:
        self.exports = self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a collector answers the exporter's session

            def do_POST(self):  # noqa: N802 (http.server's name)
                sink.bytes += len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                sink.exports += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def environments(variants: list[tuple[str, dict[str, str]]], folder: Path,
                 sink: Sink | None) -> tuple[dict[str, dict], list[str]]:
    """Each variant's environment to start with: its own, plus what COMMIT, SNAPSHOT, HOOKS and OTLP
    stand for; and the commits they named, resolved (HEAD moves)."""
    made: dict[tuple, str] = {}  # each code's PYTHONPATH entry, made once for the run
    out, commits = {}, []
    for name, env in variants:
        extra = {}
        if env.get("HOOKS", "stripped") != "stripped" or env.get("SNAPSHOT", "1") != "1":
            raise SystemExit(f"{name}: HOOKS takes one value, stripped; SNAPSHOT one, 1")
        if "COMMIT" in env or "SNAPSHOT" in env or "HOOKS" in env:
            commit = env.get("COMMIT")
            if commit is not None:
                resolved = subprocess.run(["git", "rev-parse", "--short", f"{commit}^{{commit}}"], cwd=ROOT,
                                          capture_output=True, text=True, check=True).stdout.strip()
                commits.append(f"COMMIT={commit} is {resolved}")
            which = (commit, "HOOKS" not in env)
            if which not in made:
                made[which] = code(folder / f"code-{len(made)}", commit, hooks=which[1])
            extra["PYTHONPATH"] = made[which]
        if "OTLP" in env:
            if env["OTLP"] != "sink" or sink is None:
                raise SystemExit(f"{name}: OTLP takes one value, sink")
            extra["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.endpoint
        out[name] = {**env, **extra}
    return out, sorted(set(commits))


def hook_cost(iterations: int = 200_000, repeats: int = 7) -> float:
    """Tracing off, in process: ns per request of the tracing hooks Pipeline.infer and run hold for
    one /v1 predict (the request's trace, entered; six step marks; the traceparent for its jobs),
    less an empty loop's; the median of `repeats`."""
    spans = tracing.Spans("funnel-web")
    spans.tracer = None  # off, whatever this process's environment says
    name, request_id = MODEL, "0123456789abcdef"

    def hooks() -> None:
        trace = spans.request("predict", name, "", "", request_id)
        with trace:
            trace.step("parse", model=name, model_version=1)
            trace.step("prepare")
            trace.step("admit", items=1)
            traceparent = trace.traceparent
            trace.step("enqueue", priority="normal")
            trace.step("wait")
            trace.step("render")
        assert not traceparent

    def nothing() -> None:
        pass

    def per_call(body) -> float:
        started = time.perf_counter_ns()
        for _ in range(iterations):
            body()
        return (time.perf_counter_ns() - started) / iterations

    return statistics.median(per_call(hooks) - per_call(nothing) for _ in range(repeats))


def wait_for_answer(url: str, body: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, _, _ = http("POST", url, body=body.encode(), headers={"Content-Type": "application/json"},
                                timeout=5)
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer within {timeout_s:g} s")
        time.sleep(0.2)


def start(name: str, env: dict[str, str]):
    if name.startswith("bare"):
        return bare(env)
    # Each process takes the settings it declares and ignores the rest: one variant can set both tiers.
    settings = {k: v for k, v in env.items() if k not in BENCH_ONLY}
    return Stack(models=[MODEL], web_env=settings, worker_env=settings, workers=[MODEL] * int(env.get("WORKERS", 1)),
                 log_dir=ROOT / "benchmarks" / "results" / "tmp",
                 grpc_port=free_port() if env.get("ROUTE") == "grpc" else None)


def grpc_load(port: int, clients: int, duration_s: int, items: int) -> dict:
    """benchmarks/grpc_load.py in a process of its own, as wrk is: its rps, errors, p50 and p99."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.grpc_load", f"127.0.0.1:{port}", "--concurrency",
                          str(clients), "--duration", str(duration_s), "--items", str(items)], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=duration_s + 60).stdout
    return json.loads(out.splitlines()[-1])


def measure(name: str, env: dict[str, str], clients: list[int], duration_s: int) -> list[dict]:
    runs = []
    route, items = env.get("ROUTE", "v1"), int(env.get("ITEMS", 1))
    with start(name, env) as stack:
        if route == "grpc":
            def drive(c: int, seconds: int) -> dict:
                return grpc_load(stack.grpc_port, c, seconds, items)
            front = stack.grpc
        else:
            path, body_of = ROUTES[route]
            body = body_of(items)
            wait_for_answer(stack.url + path, body)

            def drive(c: int, seconds: int) -> dict:
                return wrk(stack.url + path, c, seconds, body)
            front = stack.web
        drive(clients[0], 3)  # warm-up
        groups = {"worker": [p.pid for p in stack.workers], "web": [front.pid],
                  "redis": [stack.redis.process.pid] if stack.redis else []}
        for c in clients:
            before, busy = cpu_ticks(groups), machine_busy_s()
            result = drive(c, duration_s)
            spent = cpu_seconds(before, cpu_ticks(groups))
            busy = machine_busy_s() - busy
            result["rps"] *= items  # items, not calls
            requests = result["rps"] * duration_s
            assert result["errors"] == 0, result
            runs.append({"variant": name, "clients": c, "rps": result["rps"], "p50": result["p50"],
                         "p99": result["p99"], **{f"{group}_ms": spent[group] / requests * 1000 for group in groups},
                         "other_cores": max(0.0, busy - sum(spent.values())) / duration_s})
    return runs


def measure_rounds(variants: list[tuple[str, dict[str, str]]], started: dict[str, dict], clients: list[int],
                   rounds: int, duration_s: int, max_other: float) -> tuple[dict[tuple[str, int], list[dict]], int]:
    """Every variant once a round, the order rotating and the clients' sweep reversed every other
    round: the runs by (variant, clients), in round order, and how many were made again because
    the rest of the machine used more than max_other cores meanwhile."""
    runs: dict[tuple[str, int], list[dict]] = {}
    repeated = 0
    for round_ in range(rounds):
        shift = round_ % len(variants)
        for name, _ in variants[shift:] + variants[:shift]:
            for attempt in range(1 + LOAD_RETRIES):
                got = measure(name, started[name], clients if round_ % 2 == 0 else clients[::-1], duration_s)
                loaded = [r["other_cores"] for r in got if r["other_cores"] > max_other]
                if not loaded or attempt == LOAD_RETRIES:
                    break
                repeated += 1
                print(f"round {round_ + 1}: {name} ran beside {max(loaded):.2f} other cores: again", flush=True)
            for run in got:
                runs.setdefault((name, run["clients"]), []).append(run)
                print(f"round {round_ + 1}: {name}, {run['clients']} clients: {run['rps']:.0f} req/s, "
                      f"web {run['web_ms']:.3f} ms/req, worker {run['worker_ms']:.2f}, "
                      f"other {run['other_cores']:.2f} cores", flush=True)
    return runs, repeated


def table(variants: list[tuple[str, dict[str, str]]], clients: list[int], runs: dict[tuple[str, int], list[dict]],
          baselines: list[str], ceiling: float) -> list[str]:
    """The report's table: a row per clients and variant, medians over rounds [min–max]."""
    against = "".join(f" web / {b}'s, per round [min–max] |" for b in baselines)
    rows = ["| variant | web settings | clients | items/s [min–max] | vs ceiling | p50 ms | p99 ms | CPU ms/item "
            f"web [min–max] |{against} worker | redis | load + other (cores) |",
            "|" + "---|" * (11 + len(baselines))]
    for c in clients:
        for name, env in variants:
            got = runs[name, c]

            def med(key, got=got):
                return statistics.median(r[key] for r in got)

            rps, web = [r["rps"] for r in got], [r["web_ms"] for r in got]
            ratios = ""
            for baseline in baselines:
                # Paired by round (the runs of a round are the variants' i-th): the machine's drift cancels.
                each = [r["web_ms"] / b["web_ms"] for r, b in zip(got, runs[baseline, c])]
                ratios += f" {statistics.median(each):.3f} [{min(each):.3f}–{max(each):.3f}] |"
            settings = ", ".join(f"{k}={v}" for k, v in env.items()) or "defaults"
            rows.append(f"| {name} | {settings} | {c} | {med('rps'):.0f} [{min(rps):.0f}–{max(rps):.0f}] | "
                        f"{med('rps') / ceiling:.2f} | {med('p50'):.1f} | {med('p99'):.1f} | "
                        f"{med('web_ms'):.3f} [{min(web):.3f}–{max(web):.3f}] |{ratios} "
                        f"{med('worker_ms'):.2f} | {med('redis_ms'):.3f} | {med('other_cores'):.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.web_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10, help="seconds of each wrk run")
    parser.add_argument("--clients", default="32", help="comma-separated numbers of concurrent clients")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=FUNNEL_SETTING=value,... (the stack's environment, web tier and worker; "
                             "WORKERS=N: N workers; COMMIT=<rev>: that commit's code; OTLP=sink: traced); "
                             "repeatable")
    parser.add_argument("--baseline", action="append", default=[],
                        help="a variant the others' web CPU is compared with, round by round (default: the first); "
                             "repeatable")
    parser.add_argument("--max-other", type=float, default=float("inf"),
                        help=f"run a variant again (at most {LOAD_RETRIES} times) when the rest of the machine "
                             "used more than this many cores meanwhile (shared machines)")
    parser.add_argument("--hook-cost", action="store_true",
                        help="also time, in process, the tracing calls of one predict with tracing off")
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    variants = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    baselines = args.baseline or [variants[0][0]]
    for baseline in baselines:
        if baseline not in dict(variants):
            raise SystemExit(f"--baseline {baseline}: no such variant")
    clients = [int(c) for c in args.clients.split(",")]
    sink = Sink() if any("OTLP" in env for _, env in variants) else None
    with tempfile.TemporaryDirectory(prefix="web-cpu-") as folder:
        started, commits = environments(variants, Path(folder), sink)
        runs, repeated = measure_rounds(variants, started, clients, args.rounds, args.duration, args.max_other)
    if sink is not None:
        sink.close()
    ceiling = in_process_ceiling(32)
    notes = [", ".join(commits) + "."] if commits else []
    if args.max_other != float("inf"):
        notes.append(f"--max-other {args.max_other:g}: {repeated} runs made again for the machine's other load.")
    if sink is not None:
        notes.append(f"OTLP=sink: {sink.exports} exports ({sink.bytes / 1e6:.1f} MB) reached the sink.")
    if args.hook_cost:
        notes.append(f"Tracing off, in process: the tracing calls of one /v1 predict cost {hook_cost():.0f} ns "
                     "(benchmarks/web_cpu.py's hook_cost).")
    stamp = dt.datetime.now()
    report = (f"# Web tier CPU per request, {stamp:%Y-%m-%d %H:%M}\n\nMachine: {machine()}\n\n"
              f"Command: `python -m benchmarks.web_cpu {' '.join(argv or sys.argv[1:])}` ({MODEL}, wrk -t1 "
              f"-d{args.duration}s, one sentence per POST, or benchmarks/grpc_load.py for ROUTE=grpc; "
              f"medians over {args.rounds} interleaved rounds, "
              f"the variants' order rotating and the clients' sweep reversed every other round; in-process "
              f"ONNX ceiling at batch 32: {ceiling:.0f} items/s)\n\n"
              + "\n".join(table(variants, clients, runs, baselines, ceiling)) + "\n"
              + "".join(f"\n{note}\n" for note in notes))
    save("web-cpu", report)
    shutil.rmtree(ROOT / "benchmarks" / "results" / "tmp", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
