"""Finding a model's Task: by the name model.json gives, or by import path.

model.json's "task" is either the name of a registered task (the entry point
group "funnel.tasks": Funnel registers image_classification,
text_embedding and text_recognition in its pyproject.toml, and any installed
distribution may add its own) or an import path "package.module:Class" to a Task subclass of your
own, importable where the web tier and the workers run. Adding a model needs
no edit here, nor anywhere in web/, worker/ or common/.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points

from funnel.common.store import ModelSpec
from funnel.common.tasks.base import (
    INPUT_KINDS,
    Chain,
    Context,
    InputKind,
    Inputs,
    Prepared,
    StepFailed,
    Task,
    Upload,
    WithContext,
)

__all__ = ["Task", "Chain", "StepFailed", "Inputs", "InputKind", "INPUT_KINDS", "Context", "Prepared", "Upload",
           "WithContext", "ENTRY_POINT_GROUP", "task_class", "load", "registered"]

ENTRY_POINT_GROUP = "funnel.tasks"


def registered() -> dict[str, str]:
    """Registered task names -> their import paths."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def task_class(name: str) -> type[Task]:
    """The Task subclass a model.json names."""
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"task {name!r} cannot be imported: {exc}") from None
    else:
        matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not matches:
            raise ValueError(f"unknown task {name!r}; registered: {', '.join(sorted(registered()))} "
                             f"(or name a class as 'package.module:Class')")
        found = matches[0].load()
    if not (isinstance(found, type) and issubclass(found, Task)):
        raise ValueError(f"task {name!r} is not a subclass of funnel.common.tasks.Task")
    if getattr(found, "input_kind", None) not in INPUT_KINDS:
        raise ValueError(f"task {name!r} declares input_kind {getattr(found, 'input_kind', None)!r}; "
                         f"one of {', '.join(INPUT_KINDS)}")
    if found.input_kind == "file" and not found.content_types:
        raise ValueError(f"task {name!r} takes files but declares no content_types")
    return found


def load(spec: ModelSpec, limits: Mapping[str, int] | None = None) -> Task:
    """The Task serving this model, with its limits (defaults < model.json < the limits given)."""
    return task_class(spec.task)(spec, limits)
