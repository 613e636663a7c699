"""Adding a model version to the store: what `funnel add` and the repository API's load both do.

The version's folder is built aside and swapped in whole (common/store.py's
write_model); its model.json must name a task that loads, and a graph for the
task to run, unless the task runs its model in Python or is a chain. A version
whose task fails to load from the written folder is taken out again: the store
never holds a version the tiers cannot serve.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from funnel.common import tasks
from funnel.common.contracts.keys import check_name, check_version
from funnel.common.store import list_versions, load_spec, write_model
from funnel.common.tasks import Task


def graph_names(onnx_path: Path) -> tuple[list[str], list[str]]:
    """The ONNX graph's input and output names (what the worker feeds and reads)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]


def check(meta: dict[str, Any], folder: Path) -> dict[str, Any]:
    """model.json as it will be written: its task importable, a chain with its steps, a graph where the
    task needs one (its feeds and outputs read from an ONNX graph where not given); ValueError otherwise."""
    if not isinstance(meta.get("task"), str):
        raise ValueError('model.json names its task ("task": "package.module:Class" or a registered name)')
    task_class = tasks.task_class(meta["task"])
    if task_class.in_chain() and not meta.get("steps"):
        raise ValueError('a chain names its steps (--steps MODEL,MODEL; "steps" in model.json)')
    if meta.get("steps") and not task_class.in_chain():
        raise ValueError("steps name a chain's steps, and this task is no Chain")
    graphs = [meta[key] for key in ("onnx", "torchscript") if meta.get(key)]
    if not (graphs or task_class.in_python() or task_class.in_chain()):
        raise ValueError("give --onnx, --torchscript, or both (\"onnx\", \"torchscript\" in model.json), or a task "
                         "with load and predict, which runs its model in Python, or a chain with its steps")
    for graph in graphs:
        if not isinstance(graph, str) or not (folder / graph).is_file():
            raise ValueError(f"no such file in the model's folder: {graph!r}")
    if meta.get("onnx") and not (meta.get("feeds") and meta.get("outputs")):
        meta["feeds"], meta["outputs"] = graph_names(folder / meta["onnx"])
    return meta


def missing_steps(store: str | Path, steps: list[str]) -> list[str]:
    """The steps ("name" or "name:version") the store does not hold."""
    def held(step: str) -> bool:
        name, _, pinned = step.partition(":")
        try:
            versions = list_versions(store, name)
        except ValueError:  # not a model's name at all
            return False
        return bool(versions) and (not pinned or (pinned.isdigit() and int(pinned) in versions))
    return [step for step in steps if not held(step)]


def add(store: str | Path, name: str, build: Callable[[Path], dict[str, Any]],
        version: int | None = None, steps_to_come: bool = False) -> tuple[Path, int, Task]:
    """Write a version: build(folder) puts its files and returns its model.json, which check() reads.
    version None: version 1 as write_model writes it. Returns its folder, its version and its task;
    ValueError, and nothing written, for a name, version, model.json or task that cannot serve, or a
    chain whose steps are not in the store (unless steps_to_come: they will be added after it)."""
    check_name(name)
    if version is not None:
        check_version(version)

    def checked(tmp: Path) -> dict[str, Any]:
        meta = check(build(tmp), tmp)
        if not steps_to_come and (missing := missing_steps(store, meta.get("steps") or [])):
            raise ValueError(f"the chain's steps {', '.join(missing)} are not in {store}: add them first, "
                             f"or say they are to come (funnel add --steps-to-come)")
        return meta
    folder = write_model(store, name, checked, version)
    number = version or 1
    try:
        task = tasks.load(load_spec(store, name, number))  # model.json as the tiers will read it
    except (ValueError, KeyError) as exc:
        shutil.rmtree(folder)
        raise ValueError(f"{name}: {exc}") from None
    return folder, number, task
