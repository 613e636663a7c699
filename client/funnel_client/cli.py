"""Ask a Funnel server for one answer, or many in an interactive session.

    funnel-client --model image-classifier --image cat.jpg
    funnel-client --model text-embedding --text "A man is eating food."
    funnel-client --model text-embedding --text first --text second
    funnel-client --model text-embedding --interactive
    funnel-client --model text-embedding --bulk corpus.txt --output vectors.jsonl
    funnel-client --models

Exit status: 0 answered (with --bulk: the job is done), 1 the server answered
an error (or could not be reached; with --bulk: the job failed or was
cancelled), 2 bad arguments, 130 interrupted (with --bulk: the job cancelled).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from funnel_client import Client, FunnelHTTPError

DEFAULT_URL = os.environ.get("FUNNEL_URL", "http://127.0.0.1:8000")
SHOW_VALUES = 8


def describe_error(exc: FunnelHTTPError) -> str:
    status = f"{exc.status} " if exc.status is not None else ""
    return f"error {status}{exc.code}: {exc.message}"


def format_meta(meta: dict, round_trip_ms: float | None) -> str:
    parts = []
    if meta:
        parts += [f"worker {meta.get('worker', '?')}", f"batch {meta.get('batch_size', '?')}",
                  f"queue {meta.get('queue_ms', 0):.1f} ms", f"infer {meta.get('infer_ms', 0):.1f} ms"]
    if round_trip_ms is not None:
        parts.append(f"round trip {round_trip_ms:.1f} ms")
    return "  ".join(parts)


def format_embedding(embedding: list[float]) -> str:
    norm = math.sqrt(sum(v * v for v in embedding))
    head = ", ".join(f"{v:.4f}" for v in embedding[:SHOW_VALUES])
    more = ", ..." if len(embedding) > SHOW_VALUES else ""
    return f"embedding: {len(embedding)} dimensions, norm {norm:.4f}\n  [{head}{more}]"


def format_answer(answer: dict, round_trip_ms: float | None = None) -> str:
    """A person's view of a predict answer: a top-k table, or embedding sizes and first values."""
    lines = []
    if "predictions" in answer:
        predictions = answer["predictions"]
        width = max([len("label"), *(len(p["label"]) for p in predictions)])
        lines.append(f"  #  {'label':<{width}}  index  probability")
        for rank, p in enumerate(predictions, 1):
            lines.append(f"{rank:>3}  {p['label']:<{width}}  {p['index']:>5}  {p['probability']:>11.4f}")
        lines.append(format_meta(answer.get("meta") or {}, round_trip_ms))
    elif "embedding" in answer:
        lines.append(format_embedding(answer["embedding"]))
        lines.append(format_meta(answer.get("meta") or {}, round_trip_ms))
    elif "results" in answer:
        metas = answer.get("meta") or [{}] * len(answer["results"])
        for i, (result, meta) in enumerate(zip(answer["results"], metas)):
            shown = format_embedding(result["embedding"]) if "embedding" in result else json.dumps(result)
            lines.append(f"[{i}] " + shown)
            lines.append("    " + format_meta(meta, None))
        if round_trip_ms is not None:
            lines.append(f"{len(answer['results'])} results, round trip {round_trip_ms:.1f} ms")
    else:
        lines.append(json.dumps(answer, indent=2))
    return "\n".join(lines)


def format_models(listing: dict) -> str:
    lines = [f"{'model':<20} {'task':<22} {'batch':>5} {'queue':>6} {'workers':>8}"]
    for m in listing.get("models", []):
        lines.append(f"{m.get('name', '?'):<20} {m.get('task', '?'):<22} {m.get('batch_size', '?'):>5} "
                     f"{m.get('queue', '?'):>6} {len(m.get('workers', [])):>8}")
    return "\n".join(lines)


def model_listing(client: Client, model: str) -> dict | None:
    """The model as GET /v1/models describes it (None when it is not served)."""
    for m in client.models().get("models", []):
        if m.get("name") == model:
            return m
    return None


# What one line of interactive input is, by the model's input kind (GET /v1/models).
PROMPTS = {"image": "a path to an image file", "text": "a text", "json": "a JSON value", "file": "a path to a file"}


def timed_predict(client: Client, model: str, **inputs) -> tuple[dict, float]:
    started = time.perf_counter()
    answer = client.predict(model, **inputs)
    return answer, (time.perf_counter() - started) * 1000


def one_shot(client: Client, args) -> int:
    inputs: dict
    if args.image:
        inputs, what = {"image": args.image}, args.image
    elif args.file:
        given = [(path, args.content_type) if args.content_type else path for path in args.file]
        inputs = {"file": given[0]} if len(given) == 1 else {"files": given}
        what = args.file[0] if len(given) == 1 else f"{len(given)} files"
    elif args.input:
        values = [json.loads(v) for v in args.input]
        inputs = {"input": values[0]} if len(values) == 1 else {"inputs": values}
        what = args.input[0] if len(values) == 1 else f"{len(values)} inputs"
    elif len(args.text) == 1:
        inputs, what = {"text": args.text[0]}, repr(args.text[0])
    else:
        inputs, what = {"texts": args.text}, f"{len(args.text)} texts"
    answer, ms = timed_predict(client, args.model, **inputs)
    if args.json:
        print(json.dumps(answer))
    else:
        print(f"{args.model} <- {what}\n{format_answer(answer, ms)}")
    return 0


def prompted_lines(prompt: str, stdin) -> Iterator[str]:
    """Lines typed at the prompt until end of input or quit; echoed when they come from a pipe."""
    tty = stdin.isatty()
    while True:
        if tty:
            try:
                line = input(prompt)
            except EOFError:
                print()
                return
        else:
            print(prompt, end="", flush=True)
            line = stdin.readline()
            if not line:
                print()
                return
            line = line.rstrip("\r\n")
            print(line)
        if line.strip() in ("quit", "exit", r"\q"):
            return
        if line.strip():
            yield line


def answer_line(client: Client, model: str, kind: str, line: str) -> tuple[dict, float] | str:
    """The answer to one line of input, or what went wrong, as a line to print."""
    try:
        if kind in ("image", "file"):
            path = Path(line.strip()).expanduser()
            if not path.is_file():
                return f"no such file: {path}"
            return timed_predict(client, model, **{kind: path})
        if kind == "json":
            return timed_predict(client, model, input=json.loads(line))
        return timed_predict(client, model, text=line)
    except FunnelHTTPError as exc:
        return describe_error(exc)
    except OSError as exc:
        return f"could not read {line.strip()}: {exc}"
    except ValueError as exc:
        return f"not JSON: {exc}"


def interactive(client: Client, args, stdin=sys.stdin) -> int:
    listing = model_listing(client, args.model)
    if listing is None:
        print(f"no model named {args.model!r} on {client.url}", file=sys.stderr)
        return 1
    kind = listing.get("input_kind", "text")
    print(f"{args.model} ({listing.get('task')}) at {client.url}: type {PROMPTS.get(kind, 'a text')} per line; "
          f"'quit' or end of input stops.", flush=True)
    for line in prompted_lines(f"{args.model}> ", stdin):
        got = answer_line(client, args.model, kind, line)
        if isinstance(got, str):
            print(got, flush=True)
            continue
        answer, ms = got
        print(json.dumps(answer) if args.json else format_answer(answer, ms), flush=True)
    return 0


# -- bulk: a file, line by line, as one job -----------------------------------


class ProgressBar:
    """A job's progress on stderr: redrawn in place on a terminal, a line per tenth elsewhere."""

    WIDTH = 30

    def __init__(self, stream: TextIO = sys.stderr, enabled: bool = True):
        self.stream, self.enabled = stream, enabled
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.shown_tenth = -1

    def show(self, status: dict) -> None:
        if not self.enabled:
            return
        progress = status["progress"]
        done, total, failed = progress["done"], progress["total"], progress["failed"]
        share = done / total if total else 1.0
        if not self.tty:
            if int(share * 10) == self.shown_tenth:
                return
            self.shown_tenth = int(share * 10)
        elapsed = time.monotonic() - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f", {(total - done) / rate:.0f} s left" if 0 < rate and done < total else ""
        filled = int(share * self.WIDTH)
        line = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done:,}/{total:,} {share:4.0%} "
                f"{rate:,.0f}/s{eta}{f', {failed:,} failed' if failed else ''} ({status['state']})")
        if self.tty:
            self.stream.write(f"\r{line}\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def bulk_items(source: TextIO, kind: str) -> list:
    """The non-blank lines of the file: texts, JSON values or image paths, as the model takes."""
    lines = [line.rstrip("\r\n") for line in source]
    lines = [line for line in lines if line.strip()]
    if kind == "json":
        return [json.loads(line) for line in lines]
    if kind in ("image", "file"):
        return [Path(line.strip()).expanduser() for line in lines]
    return lines


def follow(client: Client, job_id: str, bar: ProgressBar) -> dict:
    """The job's final status, its progress shown as the server's events say it moves."""
    for name, status in client.events(job_id):
        if name in ("progress", "done"):
            bar.show(status)
        if name == "done":
            return status
    return client.job_status(job_id)  # the events ended without a last one: as it stands


def bulk(client: Client, args, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    """Submit the file as one job, show its progress, write its results as JSON Lines in input order."""
    listing = model_listing(client, args.model)
    if listing is None:
        print(f"no model named {args.model!r} on {client.url}", file=sys.stderr)
        return 1
    kind = listing.get("input_kind", "text")
    if args.bulk == "-":
        items = bulk_items(stdin, kind)
    else:
        with open(args.bulk, encoding="utf-8") as source:
            items = bulk_items(source, kind)
    if not items:
        print(f"nothing to send: {args.bulk} has no non-blank line", file=sys.stderr)
        return 2
    what = {"text": "texts", "json": "inputs", "image": "images", "file": "files"}.get(kind, "texts")
    job = client.submit_job(args.model, **{what: items}, webhook=args.webhook)
    print(f"job {job['id']}: {len(items):,} {what} for {args.model}", file=sys.stderr, flush=True)
    bar = ProgressBar(enabled=not args.quiet)
    try:
        final = follow(client, job["id"], bar)
    except KeyboardInterrupt:
        bar.close()
        client.cancel(job["id"])
        print(f"interrupted: job {job['id']} cancelled", file=sys.stderr)
        return 130
    bar.close()
    out = open(args.output, "w", encoding="utf-8") if args.output else stdout  # closed below
    try:
        written = 0
        for result in client.stream_results(job["id"]):
            out.write(json.dumps(result, separators=(",", ":")) + "\n")
            written += 1
    finally:
        if out is not stdout:
            out.close()
    failed = final["progress"]["failed"]
    print(f"job {job['id']} {final['state']}: {written:,} results written to {args.output or 'stdout'}"
          f"{f', {failed:,} of them errors' if failed else ''}", file=sys.stderr)
    return 0 if final["state"] == "done" else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="funnel-client",
        description="Send an image or text to a Funnel server and print its answer.",
        epilog="examples:\n"
               "  funnel-client --model image-classifier --image cat.jpg\n"
               "  funnel-client --model text-embedding --text 'A man is eating food.'\n"
               "  funnel-client --model text-embedding --interactive\n"
               "  funnel-client --model clip-levels --file a.wav --file b.wav\n"
               "  funnel-client --model text-embedding --bulk corpus.txt --output vectors.jsonl\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=DEFAULT_URL, help=f"the server (default: $FUNNEL_URL or {DEFAULT_URL})")
    p.add_argument("--api-key", default=os.environ.get("FUNNEL_API_KEY"),
                   help="Bearer key, when the server has FUNNEL_API_KEYS (default: $FUNNEL_API_KEY)")
    p.add_argument("--model", help="model to ask: image-classifier, text-embedding, ... (see --models)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--image", help="image file to classify")
    source.add_argument("--text", action="append", default=[],
                        help="text to embed; give it several times for one request with many texts")
    source.add_argument("--input", action="append", default=[],
                        help="a JSON value, for a model whose input kind is json; give it several times "
                             "for one request with many")
    source.add_argument("--file", action="append", default=[],
                        help="a file, for a model whose input kind is file; give it several times for one "
                             "request with many")
    source.add_argument("--interactive", "-i", action="store_true",
                        help="read one input per line (a text, an image path or a JSON value, as the model "
                             "takes) until EOF or 'quit'")
    source.add_argument("--bulk", metavar="FILE",
                        help="send a file as one bulk job, one input per line (a text, a JSON value or an "
                             "image path, as the model takes; blank lines skipped, '-' reads stdin), show its "
                             "progress, and write its results as JSON Lines in input order")
    source.add_argument("--models", action="store_true", help="list the served models and exit")
    p.add_argument("--content-type", help="with --file: the files' content type (default: guessed from "
                                          "each file's name and first bytes)")
    p.add_argument("--output", "-o", help="with --bulk: write the JSON Lines to this file (default: stdout)")
    p.add_argument("--webhook", help="with --bulk: a URL the server POSTs the job's status to when it is final")
    p.add_argument("--quiet", "-q", action="store_true", help="with --bulk: no progress bar")
    p.add_argument("--json", action="store_true", help="print the server's JSON instead of a table")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one answer (default 60)")
    p.add_argument("--retries", type=int, default=3,
                   help="retries of a 503, after its Retry-After (default 3)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not args.models:
        if not args.model:
            p.error("--model is required (or --models to list them)")
        if not (args.image or args.text or args.input or args.file or args.interactive or args.bulk):
            p.error("give --image, --text, --input, --file, --interactive or --bulk")
    if not args.bulk and (args.output or args.webhook):
        p.error("--output and --webhook go with --bulk")
    client = Client(args.url, api_key=args.api_key, timeout=args.timeout, retries=args.retries)
    try:
        if args.models:
            listing = client.models()
            print(json.dumps(listing, indent=2) if args.json else format_models(listing))
            return 0
        if args.interactive:
            return interactive(client, args)
        if args.bulk:
            return bulk(client, args)
        return one_shot(client, args)
    except FunnelHTTPError as exc:
        print(describe_error(exc), file=sys.stderr)
        return 1
    except OSError as exc:  # an --image or --file that cannot be read
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # an --input (or a --bulk line, for a JSON model) that is not JSON
        print(f"error: not JSON: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
