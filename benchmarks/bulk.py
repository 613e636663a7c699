"""A bulk job against the in-process ceiling: how close the job path comes to the model alone.

    python -m benchmarks.bulk [--items 8000] [--rounds 2] [--duration 10] [--store model_store] [--before DIR]
    python -m benchmarks.bulk --batch-api --items 10000 [--rounds 2]

The ceiling is benchmarks/peers/ceiling.py on one sentence: the text model
in-process, batches of 32, each item tokenized again (`batch32_pre`: all a
server does but HTTP and queues). Funnel is a stack as `funnel up` starts it
(one text-embedding worker, ONNX on the CPU, its defaults), sent a bulk job of
--items copies of the same sentence through funnel_client and timed from the
submit's answer (its items stored, none run yet) to the status that says every
item is done. Each round runs both, the ceiling first; the table gives each
round and the median ratio, and goes to benchmarks/results/bulk-<date>.md with
the machine.

--before DIR (a checkout of an older Funnel, e.g. `git worktree add
/tmp/before <commit>`) runs a second stack, web tier and worker from that
checkout, beside this one's: each round sends both the same job, the order
alternating, so that the table compares them on the same minutes of the machine.

--batch-api compares an OpenAI batch (POST /v1/batches through the openai SDK, one line a text)
with a bulk job of the same --items distinct texts on one stack, the order alternating each
round, and checks the batch: each custom_id answered once, a sample equal to /v1/embeddings'.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks import commit_of, save
from benchmarks.core import machine
from benchmarks.measure import run_ceiling
from benchmarks.payloads import Payload
from funnel.scripts.stack import Stack
from funnel_client import Client
from funnel_client.client import JOB_FINAL_STATES

MODEL = "text-embedding"
SENTENCE = "A man is eating food on a sunny afternoon in the park."
POLL_S = 0.25  # a status read costs the web tier CPU the model could use; 0.25 s is 1% of a job of 8000


def ceiling(args, work: Path, log) -> float:
    """Items/s of the model in-process at batch 32, each item tokenized again."""
    options = SimpleNamespace(duration=args.duration, store=args.store, device="cpu", web_processes=0)
    payload = Payload(json.dumps({"text": SENTENCE}).encode(), "application/json", "one sentence")
    return float(run_ceiling(MODEL, "onnx", options, work, payload, log)["batch32_pre"])


def bulk_job(url: str, items: int) -> float:
    """Items/s of one bulk job of `items` copies of the sentence, from its submit's answer to done."""
    return bulk_texts(url, [SENTENCE] * items)


def batch_api(url: str, texts: list[str]) -> float:
    """Items/s of one OpenAI batch of these texts, a line each, through the openai SDK: from the
    create's answer to the status `completed`. Every custom_id must be answered once, and a sample of
    answers equal /v1/embeddings' for the same text."""
    import io

    import numpy as np
    import openai

    lines = "\n".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings",
                                  "body": {"model": MODEL, "input": text, "encoding_format": "float"}})
                      for i, text in enumerate(texts))
    with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300) as client:
        uploaded = client.files.create(file=("bench.jsonl", io.BytesIO(lines.encode())), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        started = time.monotonic()
        while batch.status not in ("completed", "failed", "cancelled", "expired"):
            time.sleep(POLL_S)
            batch = client.batches.retrieve(batch.id)
        seconds = time.monotonic() - started
        output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
        ids = sorted(o["custom_id"] for o in output)
        if batch.status != "completed" or ids != sorted(f"line-{i}" for i in range(len(texts))):
            raise RuntimeError(f"the batch ended {batch.status}, {len(ids)} of {len(texts)} lines answered "
                               f"({len(set(ids))} distinct)")
        by_id = {o["custom_id"]: o["response"]["body"]["data"][0]["embedding"] for o in output}
        sample = list(range(0, len(texts), max(1, len(texts) // 64)))[:64]
        expected = client.embeddings.create(model=MODEL, input=[texts[i] for i in sample], encoding_format="float")
        for i, answer in zip(sample, expected.data):
            if not np.allclose(by_id[f"line-{i}"], answer.embedding, atol=1e-5):
                raise RuntimeError(f"line {i}'s embedding differs from /v1/embeddings'")
    return len(texts) / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bulk", description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=8000, help="texts in each bulk job")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=10, help="seconds of each ceiling measurement")
    parser.add_argument("--store", default="model_store")
    parser.add_argument("--before", type=Path, help="a checkout whose stack runs the same jobs beside this one's")
    parser.add_argument("--batch-api", action="store_true",
                        help="also send each round's texts as an OpenAI batch through the openai SDK (a line each)")
    args = parser.parse_args(argv)
    if args.batch_api:
        return batches(args, argv)
    rows: list[tuple[str, int, float, float]] = []  # code, round, ceiling, job
    with tempfile.TemporaryDirectory(prefix="funnel-bulk-") as tmp, contextlib.ExitStack() as stacks:
        work = Path(tmp)
        codes = {"now": stacks.enter_context(Stack(model_store=args.store, models=[MODEL], log_dir=work / "now"))}
        if args.before:
            env = {"PYTHONPATH": str(funnel_from(args.before, work))}
            codes[f"before ({commit_of(args.before)})"] = stacks.enter_context(Stack(
                model_store=args.store, models=[MODEL], log_dir=work / "before", web_env=env, worker_env=env))
        for stack in codes.values():
            bulk_job(stack.url, 320)  # warm-up: connections, the worker's cost fit
        with open(work / "ceiling.log", "w") as log:
            for round_ in range(args.rounds):
                top = ceiling(args, work, log)
                for code in (list(codes) if round_ % 2 == 0 else list(codes)[::-1]):
                    rate = bulk_job(codes[code].url, args.items)
                    rows.append((code, round_ + 1, top, rate))
                    print(f"round {round_ + 1}: ceiling {top:.0f} items/s, {code}: bulk job {rate:.0f} "
                          f"({rate / top:.2f})", flush=True)
    table = ["| code | round | ceiling items/s (in-process, batch 32, tokenized) | bulk job items/s | of the ceiling |",
             "|---|---|---|---|---|"]
    table += [f"| {code} | {n} | {top:.0f} | {rate:.0f} | {rate / top:.2f} |" for code, n, top, rate in rows]
    medians = [f"{code} **{statistics.median(r / t for c, _, t, r in rows if c == code):.2f}**" for code in codes]
    save("bulk", report("A bulk job against the in-process ceiling", argv,
                        f"{args.items:,} copies of one sentence a job", table,
                        f"Median of the ceiling: {', '.join(medians)}."))
    return 0


def report(title: str, argv: list[str] | None, what: str, table: list[str], summary: str) -> str:
    return (f"# {title}, {time.strftime('%Y-%m-%d %H:%M')}\n\nMachine: {machine()}\n\nCommand: "
            f"`python -m benchmarks.bulk {' '.join(argv if argv is not None else sys.argv[1:])}` ({MODEL}, "
            f"one worker at its defaults, {what})\n\n" + "\n".join(table) + f"\n\n{summary}\n")


def batches(args, argv: list[str] | None) -> int:
    """Each round, a bulk job and an OpenAI batch of the same --items distinct texts on one stack, the
    order alternating: the batch's items/s against the job's."""
    texts = [f"{SENTENCE} Line {i}." for i in range(args.items)]
    rows: list[tuple[int, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="funnel-batches-") as tmp, \
            Stack(model_store=args.store, models=[MODEL], log_dir=Path(tmp)) as stack:
        bulk_job(stack.url, 320)  # warm-up
        batch_api(stack.url, texts[:320])
        for round_ in range(args.rounds):
            first, second = (bulk_texts, batch_api) if round_ % 2 == 0 else (batch_api, bulk_texts)
            rates = {fn: fn(stack.url, texts) for fn in (first, second)}
            rows.append((round_ + 1, rates[bulk_texts], rates[batch_api]))
            print(f"round {round_ + 1}: bulk job {rates[bulk_texts]:.0f} items/s, batch {rates[batch_api]:.0f} "
                  f"({rates[batch_api] / rates[bulk_texts]:.2f})", flush=True)
    table = ["| round | bulk job items/s | OpenAI batch items/s | batch / job |", "|---|---|---|---|"]
    table += [f"| {n} | {job:.0f} | {batch:.0f} | {batch / job:.2f} |" for n, job, batch in rows]
    save("batches", report("An OpenAI batch against a bulk job", argv,
                           f"{args.items:,} distinct texts, a line each; every custom_id checked answered once, "
                           "64 answers against /v1/embeddings", table,
                           f"Median batch / job: **{statistics.median(b / j for _, j, b in rows):.2f}**."))
    return 0


def bulk_texts(url: str, texts: list[str]) -> float:
    """Items/s of one bulk job of these texts, from its submit's answer to done."""
    with Client(url, timeout=300) as client:
        job = client.submit_job(MODEL, texts)
        started = time.monotonic()
        while (status := client.job_status(job["id"]))["state"] not in JOB_FINAL_STATES:
            time.sleep(POLL_S)
        seconds = time.monotonic() - started
    if status["state"] != "done" or status["progress"]["done"] != len(texts):
        raise RuntimeError(f"the job ended {status['state']} with {status['progress']}")
    return len(texts) / seconds


def funnel_from(checkout: Path, work: Path) -> Path:
    """A folder whose `funnel` is the checkout: first on PYTHONPATH, its code runs instead of this one's."""
    tree = work / "before-path"
    tree.mkdir()
    (tree / "funnel").symlink_to(checkout.resolve(), target_is_directory=True)
    return tree


if __name__ == "__main__":
    raise SystemExit(main())
