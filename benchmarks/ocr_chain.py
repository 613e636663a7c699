"""The OCR chain against doing the same by hand, and on one worker: ways to read one page, side by side.

    python -m benchmarks.ocr_chain [--clients 8] [--duration 20] [--rounds 2] [--lines 20] [--systems A,B]

- **chain**: `POST /v1/models/ocr/predict`, Funnel's chain of text-detector, text-direction and
  text-recognizer (common/tasks/ocr.py), the stack `funnel up` starts for those four models (a
  worker per model).
- **chain on one worker**: the same chain with one worker serving all four (`--models '*'`), and
  **chain on one worker holding 2** with it holding at most two loaded (`--max-resident 2`; the chain
  itself takes no room, so the third step is loaded in turn).
- **client-side chain**: the same stack's models called by the client itself, as a client without chains
  would: `text-detector` for the boxes, each line cut out in the client (the package's own geometry),
  then one /v2 request of all its lines to `text-recognizer`, whose rows it decodes (no direction
  step, as a client in a hurry; its lines padded as the recogniser's batches pad them, so a few
  texts may differ from RapidOCR()'s: counted, not fatal).
- **RapidOCR in Flask**: `RapidOCR()` in plain Flask, gunicorn -w 2 (benchmarks/peers/rapidocr_flask.py).

Each is driven by `--clients` Python threads in this process, each sending the same drawn page of
`--lines` lines (tests/integration/test_ocr_chain.py draws it) as fast as it is answered, for
`--duration` seconds after a warm-up; every answer is checked against RapidOCR()'s own reading of the
page (same texts). Rounds rotate the order of the three. Results (pages/s, p50 and p99 latency, median
over rounds) go to benchmarks/results/ocr-chain-<date>.md with the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import RESULTS, ROOT
from benchmarks.machine import machine
from benchmarks.systems import gunicorn, spawn, stop_group
from funnel.scripts.prepare_model import prepare
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from tests.support import http, multipart, wait_for

MODELS = ("text-detector", "text-direction", "text-recognizer", "ocr")
SYSTEMS = ("chain", "chain on one worker", "chain on one worker holding 2", "client-side chain", "RapidOCR in Flask")
ONE_WORKER = {"chain on one worker": "0", "chain on one worker holding 2": "2"}  # -> FUNNEL_MAX_RESIDENT


def lines_of(answer: dict) -> list[str]:
    return [line["text"] for line in answer["lines"]]


class ClientSide:
    """A client's own chain: detect, cut the lines out here, read them all in one /v2 request (its
    recogniser's rows decoded here, as the model's task decodes them)."""

    def __init__(self, url: str, store: Path):
        import tritonclient.http as httpclient
        from rapidocr_onnxruntime import RapidOCR

        from funnel.common import tasks
        from funnel.common.store import load_spec
        from funnel.common.tasks.ocr import recognizer_lines
        from funnel.common.tasks.text_detection import rapidocr_config

        self.url, self.recognizer_lines, self.httpclient = url, recognizer_lines, httpclient
        self.decode = tasks.load(load_spec(store, "text-recognizer")).postprocess
        self.ocr = object.__new__(RapidOCR)
        for name, value in rapidocr_config("Global").items():
            setattr(self.ocr, name, value)
        self.local = threading.local()  # a Triton client per thread: one connection each

    def read(self, page: bytes) -> dict:
        import cv2
        import numpy as np

        body, form = multipart("file", "page.png", page, "image/png")
        status, found, _ = http("POST", f"{self.url}/v1/models/text-detector/predict", body, form)
        assert status == 200, found
        image = cv2.imdecode(np.frombuffer(page, np.uint8), cv2.IMREAD_COLOR)
        boxes = self.ocr.sorted_boxes(np.asarray(found["boxes"], dtype=np.float32))
        lines = [cv2.imencode(".png", line)[1].tobytes()
                 for line, _ in self.recognizer_lines(self.ocr.get_crop_img_list(image, boxes))]
        if not hasattr(self.local, "triton"):
            self.local.triton = self.httpclient.InferenceServerClient(self.url.removeprefix("http://"))
        given = self.httpclient.InferInput("IMAGE", [len(lines)], "BYTES")
        given.set_data_from_numpy(np.array(lines, dtype=object), binary_data=True)
        answer = self.local.triton.infer("text-recognizer", [given])
        indices, scores = answer.as_numpy("indices"), answer.as_numpy("scores")
        shapes = (answer.get_output("indices").get("parameters") or {}).get("row_shapes")
        read = []
        for i in range(len(lines)):
            width = shapes[i][0] if shapes else indices.shape[1]
            read.append(self.decode({"indices": indices[i, :width].astype(np.int64), "scores": scores[i, :width]}))
        return {"lines": [{"box": box.tolist(), **r} for box, r in zip(boxes, read)
                          if r["confidence"] >= self.ocr.text_score]}


def answers(url: str, page: bytes) -> bool:
    try:
        return http("POST", url, page, {"Content-Type": "image/png"})[0] == 200
    except OSError:  # not listening yet
        return False


def drive(read, page: bytes, expected: list[str], clients: int, seconds: float) -> dict:
    latencies: list[float] = []
    wrong: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client():
        while time.monotonic() < stop:
            started = time.perf_counter()
            try:
                answer = read(page)
            except Exception as exc:  # counted, not raised: the run goes on
                with lock:
                    wrong.append(repr(exc)[:200])
                continue
            took = time.perf_counter() - started
            with lock:
                latencies.append(took)
                if lines_of(answer) != expected:
                    wrong.append("lines differ")

    began = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    latencies.sort()
    return {"pages_s": len(latencies) / wall, "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else 0,
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else 0,
            "answers": len(latencies), "wrong": len(wrong), "first_wrong": wrong[:2]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ocr_chain", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of: {', '.join(SYSTEMS)}")
    args = parser.parse_args(argv)
    systems = tuple(name for name in args.systems.split(",") if name)
    if unknown := set(systems) - set(SYSTEMS):
        parser.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    from rapidocr_onnxruntime import RapidOCR

    from tests.integration.test_ocr_chain import drawn_page

    page = drawn_page(args.lines, 2)
    expected = [text for _, text, _ in RapidOCR()(page)[0]]
    work = Path(tempfile.mkdtemp(prefix="ocr-bench-"))
    store = work / "store"
    for name in MODELS:
        prepare(store, name)
    body, form = multipart("file", "page.png", page, "image/png")
    runs: dict[str, list[dict]] = {name: [] for name in systems}
    for round_ in range(args.rounds):
        order = systems[round_ % len(systems):] + systems[:round_ % len(systems)]
        for name in order:
            if name == "RapidOCR in Flask":
                port = free_port()
                web = spawn(gunicorn("benchmarks.peers.rapidocr_flask:app", port, 2, ["-t", "120"]),
                            {**os.environ, "PYTHONPATH": str(ROOT)}, work / "flask.log")
                url = f"http://127.0.0.1:{port}/ocr"
                try:
                    wait_for(lambda url=url: answers(url, page), timeout_s=120, interval_s=0.5,
                             what="RapidOCR in Flask up")

                    def read(p, url=url):
                        return http("POST", url, p, {"Content-Type": "image/png"}, timeout=120)[1]
                    drive(read, page, expected, args.clients, 5)
                    runs[name].append(drive(read, page, expected, args.clients, args.duration))
                finally:
                    stop_group(web)
            else:
                logs = work / f"stack-{round_}-{name.replace(' ', '-')}"
                alone = name in ONE_WORKER
                with Stack(model_store=store, workers_per_model=None, workers=[] if alone else None,
                           log_dir=logs) as stack:
                    if alone:
                        stack.start_worker("ocr", FUNNEL_MODELS="*", FUNNEL_MAX_RESIDENT=ONE_WORKER[name])
                        stack.wait_ready(120, expected=dict.fromkeys(MODELS, 1))
                    if name.startswith("chain"):
                        def read(p, url=stack.url):
                            b, f = multipart("file", "page.png", p, "image/png")
                            return http("POST", f"{url}/v1/models/ocr/predict", b,
                                        {**f, "X-Request-Timeout": "120"}, timeout=130)[1]
                    else:
                        read = ClientSide(stack.url, store).read
                    drive(read, page, expected, args.clients, 5)
                    runs[name].append(drive(read, page, expected, args.clients, args.duration))
            print(name, runs[name][-1], flush=True)
    summary = {name: {key: statistics.median(r[key] for r in results) for key in ("pages_s", "p50_ms", "p99_ms")}
               | {"wrong": sum(r["wrong"] for r in results), "each": [round(r["pages_s"], 2) for r in results]}
               for name, results in runs.items()}
    when = dt.datetime.now(dt.UTC)
    info = machine()
    base = "chain" if "chain" in summary else systems[0]  # what the last column compares with
    chain = summary[base]["pages_s"]
    command = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# OCR: the chain, on its workers and on one, against a client-side chain and RapidOCR() in Flask, "
             f"{when:%Y-%m-%d %H:%M}", "",
             f"Machine: {info['cpu']}, {info['cores']} cores. Command: `python -m benchmarks.ocr_chain {command}`.", "",
             f"A drawn page of {args.lines} lines ({len(expected)} read by RapidOCR()), {args.clients} clients, "
             f"{args.duration:g} s a run after 5 s of warm-up, {args.rounds} rounds (median; each round's pages/s "
             f"in brackets). Every answer checked: its texts equal RapidOCR()'s.", "",
             f"| system | pages/s [each round] | p50 ms | p99 ms | wrong answers | pages/s of {base}'s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['pages_s']:.2f} {s['each']} | {s['p50_ms']:.0f} | {s['p99_ms']:.0f} | "
                     f"{s['wrong']} | {s['pages_s'] / chain:.2f} |" if s["pages_s"] else f"| {name} | 0 | | | |")
    path = RESULTS / f"ocr-chain-{when:%Y%m%d-%H%M}.md"
    path.write_text("\n".join(lines) + "\n\n```json\n" + json.dumps({"machine": info, "summary": summary,
                                                                     "runs": runs}, indent=1) + "\n```\n")
    print(path)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
