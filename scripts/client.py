"""Ask a Funnel server for one answer, or many in an interactive session.

    python scripts/client.py --model image-classifier --image cat.jpg
    python scripts/client.py --model text-embedding --text "A man is eating food."
    python scripts/client.py --model text-embedding --text first --text second
    python scripts/client.py --model text-embedding --interactive
    python scripts/client.py --models

Exit status: 0 answered, 1 the server answered an error (or could not be
reached), 2 bad arguments.
"""

from __future__ import annotations

import os
import sys

# `python scripts/this.py` puts scripts/ first on sys.path, where a script named like a standard
# module (scripts/inspect.py) would shadow it: put the repository root there instead, before any import.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = ROOT
elif ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from common.client import Client, FunnelHTTPError  # noqa: E402

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
            lines.append(f"[{i}] " + format_embedding(result["embedding"]))
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


def model_task(client: Client, model: str) -> str | None:
    """The model's task from GET /v1/models (None when it is not served)."""
    for m in client.models().get("models", []):
        if m.get("name") == model:
            return m.get("task")
    return None


def timed_predict(client: Client, model: str, **inputs) -> tuple[dict, float]:
    started = time.perf_counter()
    answer = client.predict(model, **inputs)
    return answer, (time.perf_counter() - started) * 1000


def one_shot(client: Client, args) -> int:
    if args.image:
        inputs = {"image": args.image}
    elif len(args.text) == 1:
        inputs = {"text": args.text[0]}
    else:
        inputs = {"texts": args.text}
    answer, ms = timed_predict(client, args.model, **inputs)
    if args.json:
        print(json.dumps(answer))
    else:
        what = args.image or (repr(args.text[0]) if len(args.text) == 1 else f"{len(args.text)} texts")
        print(f"{args.model} <- {what}\n{format_answer(answer, ms)}")
    return 0


def interactive(client: Client, args, stdin=sys.stdin) -> int:
    task = model_task(client, args.model)
    if task is None:
        print(f"no model named {args.model!r} on {client.url}", file=sys.stderr)
        return 1
    images = task == "image_classification"
    kind = "a path to an image file" if images else "a text"
    tty = stdin.isatty()
    print(f"{args.model} ({task}) at {client.url}: type {kind} per line; 'quit' or end of input stops.",
          flush=True)
    while True:
        if tty:
            try:
                line = input(f"{args.model}> ")
            except EOFError:
                print()
                return 0
        else:
            print(f"{args.model}> ", end="", flush=True)
            line = stdin.readline()
            if not line:
                print()
                return 0
            line = line.rstrip("\r\n")
            print(line)
        if line.strip() in ("quit", "exit", r"\q"):
            return 0
        if not line.strip():
            continue
        try:
            if images:
                path = Path(line.strip()).expanduser()
                if not path.is_file():
                    print(f"no such file: {path}", flush=True)
                    continue
                answer, ms = timed_predict(client, args.model, image=path)
            else:
                answer, ms = timed_predict(client, args.model, text=line)
        except FunnelHTTPError as exc:
            print(describe_error(exc), flush=True)
            continue
        except OSError as exc:
            print(f"could not read {line.strip()}: {exc}", flush=True)
            continue
        print(json.dumps(answer) if args.json else format_answer(answer, ms), flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python scripts/client.py",
        description="Send an image or text to a Funnel server and print its answer.",
        epilog="examples:\n"
               "  python scripts/client.py --model image-classifier --image cat.jpg\n"
               "  python scripts/client.py --model text-embedding --text 'A man is eating food.'\n"
               "  python scripts/client.py --model text-embedding --interactive\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=DEFAULT_URL, help=f"the server (default: $FUNNEL_URL or {DEFAULT_URL})")
    p.add_argument("--api-key", default=os.environ.get("FUNNEL_API_KEY"),
                   help="Bearer key, when the server has FUNNEL_API_KEYS (default: $FUNNEL_API_KEY)")
    p.add_argument("--model", help="model to ask: image-classifier, text-embedding, ... (see --models)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--image", help="image file to classify")
    source.add_argument("--text", action="append", default=[],
                        help="text to embed; give it several times for one request with many texts")
    source.add_argument("--interactive", "-i", action="store_true",
                        help="read one text (or image path, for an image model) per line until EOF or 'quit'")
    source.add_argument("--models", action="store_true", help="list the served models and exit")
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
        if not (args.image or args.text or args.interactive):
            p.error("give --image, --text or --interactive")
    client = Client(args.url, api_key=args.api_key, timeout=args.timeout, retries=args.retries)
    try:
        if args.models:
            listing = client.models()
            print(json.dumps(listing, indent=2) if args.json else format_models(listing))
            return 0
        if args.interactive:
            return interactive(client, args)
        return one_shot(client, args)
    except FunnelHTTPError as exc:
        print(describe_error(exc), file=sys.stderr)
        return 1
    except OSError as exc:  # an --image that cannot be read
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
