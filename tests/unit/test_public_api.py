"""What a user's own task imports is Funnel's public API (docs/models.md, "Adding a model"): it keeps
working from where it is, whatever moves inside the packages."""

import importlib

import pytest

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


def test_the_docs_show_only_the_public_api():
    """Every `from funnel...` import in docs/models.md's examples is one of PUBLIC's modules."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    shown = {line.split()[1] for line in text.splitlines() if line.strip().startswith("from funnel.")}
    assert shown and shown <= {module for module, _ in PUBLIC}, shown
