"""`funnel add`: put your own model into the model store, with its task.

    funnel add NAME --task mypackage.tasks:Embedder [--file weights=my-model/ ...]
    funnel add NAME --task mypackage.tasks:Pipeline --steps detector,recognizer
    funnel add NAME --task mypackage.tasks:Detector --onnx detector.onnx [--torchscript detector.pt]
               [--file labels=labels.txt ...] [--set top_k=3 ...] [--batch-size 16]
               [--description TEXT] [--version N] [--store model_store]

The task is a funnel.Task subclass in a package of yours, importable where the
web tier and the workers run (or the name of a registered task). A task with
`load` and `predict` runs its model in Python and needs no graph: its files
(weights, a fitted estimator) go in with --file. Otherwise the exported graph
takes the arrays the task's `collate` gives (named as the graph's inputs) and
returns outputs with one row per item. A chain (a funnel.Chain) runs no model of its
own: --steps names the served models it sends its items to, in order, each
already in the store (--steps-to-come: added after the chain).
`--file KEY=PATH` copies a file or a folder the task reads into the model's folder
and records it under KEY (the task opens it at `self.spec.file(KEY)`); `--set KEY=VALUE`
adds a JSON value to model.json for the task to read from `self.spec.config`.
`--version N` adds the model as version N (`<store>/NAME/N/`), beside its
other versions (a model added without versions becomes version 1, in `NAME/1/`);
without it, the model is written as today: version 1, in `NAME/` itself (or
`NAME/1/` if the model already has version folders). Workers serve one
version each (`funnel-worker --model NAME:N`); `funnel traffic` shares the
requests between them. No Funnel source changes: docs/models.md, "Adding a
model", walks through one, and "Versions" through a second version.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from funnel.common import adding
from funnel.common.store import list_versions


def key_values(pairs: list[str], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"funnel add: {flag} takes KEY=VALUE, not {pair!r}")
        out[key] = value
    return out


def build(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Copy the model's files into folder; return its model.json."""
    meta: dict[str, Any] = {"task": args.task, "description": args.description or args.name,
                            "batch_size": args.batch_size}
    if args.onnx:
        shutil.copy(args.onnx, folder / "model.onnx")
        meta["onnx"] = "model.onnx"  # its feeds and outputs are read from the graph (common/adding.py)
    elif args.torchscript and not (args.feeds and args.outputs):
        raise SystemExit("funnel add: a TorchScript model alone needs --feeds and --outputs "
                         "(the names of its inputs in call order, and of its outputs)")
    feeds, outputs = ([], []) if args.onnx else (args.feeds, args.outputs)
    if args.torchscript:
        shutil.copy(args.torchscript, folder / "model.pt")
        meta["torchscript"] = "model.pt"
    meta.update({k: v for k, v in (("feeds", feeds), ("outputs", outputs), ("steps", args.steps)) if v})
    for key, path in key_values(args.file, "--file").items():
        source = Path(path)
        if source.is_dir():
            shutil.copytree(source, folder / source.name)
        elif source.is_file():
            shutil.copy(source, folder / source.name)
        else:
            raise SystemExit(f"funnel add: --file {key}={path}: no such file or folder")
        meta[key] = source.name
    for key, value in key_values(args.set, "--set").items():
        try:
            meta[key] = json.loads(value)
        except ValueError:
            meta[key] = value  # a bare word: a string
    if args.cache_ttl:
        meta["cache"] = {"ttl_s": args.cache_ttl, "shared": args.cache_shared}
    elif args.cache_shared:
        raise SystemExit("funnel add: --cache-shared shares a cache: it needs --cache-ttl")
    return meta


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="funnel add", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("name", help="the model's name in the store and the API (letters, digits, . _ -)")
    p.add_argument("--task", required=True, help="'package.module:Class', or a registered task name")
    p.add_argument("--onnx", type=Path, help="the ONNX graph (served by --backend onnx, the default)")
    p.add_argument("--torchscript", type=Path, help="the TorchScript module (served by --backend torch)")
    p.add_argument("--feeds", type=lambda s: s.split(","), default=[],
                   help="TorchScript only: input names in call order, comma-separated")
    p.add_argument("--outputs", type=lambda s: s.split(","), default=[],
                   help="TorchScript: output names, comma-separated; Python: the name of the one output "
                        "predict's rows carry when they are not dicts (default: output)")
    p.add_argument("--steps", type=lambda s: s.split(","), default=[],
                   help="a chain's steps: served models (name or name:version) in order, comma-separated; "
                        "each must be in the store")
    p.add_argument("--steps-to-come", action="store_true",
                   help="add the chain before its steps, which are added after it (until then it answers 503)")
    p.add_argument("--file", action="append", default=[], metavar="KEY=PATH",
                   help="a file or folder the task reads (labels, weights, a fitted model), copied in")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a model.json field for the task (a JSON value, or a string)")
    p.add_argument("--batch-size", type=int, default=16, help="the workers' default batch size")
    p.add_argument("--cache-ttl", type=int, default=0, metavar="SECONDS",
                   help="cache each item's result this long, keyed by version and preprocessed input "
                        "(default: 0, no cache; docs/models.md)")
    p.add_argument("--cache-shared", action="store_true",
                   help="with API keys set, one cache for every key (default: each key its own)")
    p.add_argument("--description", default="", help="one line, shown by GET /v1/models and the page")
    p.add_argument("--version", type=int, default=None, metavar="N",
                   help="add it as version N (a positive integer) beside the model's other versions "
                        "(default: version 1, written flat in the model's folder)")
    p.add_argument("--store", default="model_store", help="the model store directory")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for path in (args.onnx, args.torchscript):
        if path is not None and not path.is_file():
            raise SystemExit(f"funnel add: no such file: {path}")
    try:
        folder, version, task = adding.add(args.store, args.name, lambda tmp: build(args, tmp), args.version,
                                             steps_to_come=args.steps_to_come)
    except ValueError as exc:
        raise SystemExit(f"funnel add: {exc}") from None
    print(f"{args.name}: version {version} added to {folder} ({type(task).__name__}, "
          f"input kind {task.input_kind}; versions now {', '.join(map(str, list_versions(args.store, args.name)))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
