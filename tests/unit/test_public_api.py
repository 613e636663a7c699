"""What a user's own task imports is Funnel's public API (docs/models.md): `from funnel import ...`, and the
modules older tasks import from, which keep working from where they are, whatever moves inside the packages."""

import importlib

import pytest

import funnel

# The names `from funnel import` gives, each the same object as at its home.
NAMES = {"Task": "funnel.common.tasks", "WithContext": "funnel.common.tasks", "Upload": "funnel.common.tasks",
         "Inputs": "funnel.common.tasks", "Context": "funnel.common.tasks", "InputKind": "funnel.common.tasks",
         "Prepared": "funnel.common.tasks", "BadInput": "funnel.common.errors",
         "FunnelError": "funnel.common.errors", "group_by_width": "funnel.common.tasks.buckets",
         "imaging": "funnel.common.tasks", "Chain": "funnel.common.tasks", "StepFailed": "funnel.common.tasks"}


def test_from_funnel_import_gives_the_same_objects_as_their_homes():
    assert sorted(funnel.__all__) == sorted(NAMES)
    for name, home in NAMES.items():
        assert getattr(funnel, name) is getattr(importlib.import_module(home), name), name


PUBLIC = [
    ("funnel.common.tasks", "Task"),
    ("funnel.common.tasks", "Inputs"),
    ("funnel.common.errors", "BadInput"),
    ("funnel.common.errors", "FunnelError"),
    ("funnel.common.tasks.imaging", "decode"),
    ("funnel.common.tasks.buckets", "group_by_width"),
]


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_a_users_task_imports_what_the_docs_show(module, name):
    assert getattr(importlib.import_module(module), name) is not None


def test_the_docs_show_only_from_funnel_import():
    """Every import of Funnel in docs/models.md's and the README's examples is `from funnel import` a public name."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    lines = [line.strip() for doc in ("docs/models.md", "README.md") for line in (root / doc).read_text().splitlines()]
    shown = [line for line in lines if line.startswith(("from funnel ", "from funnel.", "import funnel"))]
    assert shown and all(line.startswith("from funnel import ") for line in shown), shown
    names = {name.strip() for line in shown for name in line.removeprefix("from funnel import ").split(",")}
    assert names <= set(NAMES), names - set(NAMES)
