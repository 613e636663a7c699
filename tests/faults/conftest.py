"""Fault tests: real redis-server, real web and worker processes, bounded load on 127.0.0.1."""

from __future__ import annotations

import numpy as np
import pytest

from funnel.common import tasks
from funnel.common.store import load_spec
from tests import toy_model
from tests.support import FAULT_TABLE, PACE_S, PACED, TEXT, Outcome


@pytest.fixture(scope="session")
def expected_embeddings(model_store):
    """Reference embeddings computed in-process, to catch any mixed-up answer."""
    from funnel.worker.backend import load

    spec = load_spec(model_store, TEXT)
    model, task = load(spec, "onnx", "cpu"), tasks.load(spec)

    def embed(batch: list[str]) -> dict[str, np.ndarray]:
        out = {}
        for text in batch:
            out[text] = model.run(task.collate([task.preprocess(text)]))[0]["embedding"]
        return out

    return embed


@pytest.fixture(scope="session")
def paced_store(tmp_path_factory):
    """A store holding PACED: the toy scorer whose every batch takes PACE_S (and batches of up to 64),
    so that a worker holds the jobs it took that long, on any machine."""
    store = tmp_path_factory.mktemp("paced-store")
    toy_model.add_paced(store, tmp_path_factory.mktemp("paced"), PACED, batch_s=PACE_S, batch_size=64)
    return store


@pytest.fixture(scope="session")
def paced_python_store(tmp_path_factory):
    """PACED again, its model run in Python (toyscore.tasks:PythonScore, no graph), at the same pace."""
    store = tmp_path_factory.mktemp("paced-python-store")
    toy_model.add_python(store, tmp_path_factory.mktemp("paced-python"), PACED, "--set", f"pace_batch_s={PACE_S}",
                         "--batch-size", "64")
    return store


@pytest.fixture()
def report(request):
    """Record a fault's outcome for the summary table printed at the end of the run."""
    def record(outcome: Outcome, stray: int) -> None:
        FAULT_TABLE.append((request.node.name, outcome, stray))
    return record


def pytest_terminal_summary(terminalreporter):
    if not FAULT_TABLE:
        return
    write = terminalreporter.write_line
    write("")
    write("| fault | sent | succeeded | failed (status: count) | answered twice | lost | wrong answer |")
    write("|---|---|---|---|---|---|---|")
    for name, o, stray in FAULT_TABLE:
        failed = ", ".join(f"{s}: {n}" for s, n in sorted(o.statuses.items()) if s != 200) or "none"
        lost = o.sent - sum(o.statuses.values())
        write(f"| {name} | {o.sent} | {o.ok} | {failed} | {stray} | {lost} | {o.wrong} |")

