"""About 4x a stack's capacity: accepted requests finish inside their deadline, the rest get 503 at once.

First a model's capacity is measured with a closed loop and a long deadline;
then requests arrive at four times that rate (open loop) for
FUNNEL_SHED_TEST_S seconds (default 15; 60 for the figures in docs/failure-contract.md),
each with its own deadline of 1, 2 or 3 s in X-Request-Timeout (benchmarks/shedding.py
runs it and checks what came back).

The model is a paced toy scorer (tests/third_party/toyscore's PacedScore, a
fixed speed like an accelerator's), so the run is the same on any machine and
proves the shedding itself. The image classifier on the CPU, where the load
generator shares the cores with the model, is a benchmark:
`python -m benchmarks.shedding`.

    FUNNEL_SHED_TEST_S=60 .venv/bin/python -m pytest tests/faults/test_load_shedding.py -s
"""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.shedding import overload, poster
from funnel.scripts.stack import Stack
from tests import toy_model
from tests.support import FAULT_TABLE, Outcome

PACED = "paced-score"
DURATION_S = float(os.environ.get("FUNNEL_SHED_TEST_S", "15"))


@pytest.fixture(scope="module")
def paced_stack(model_store, tmp_path_factory):
    """A worker whose batches of up to 4 take 0.1 s + 0.025 s per item: 20 items/s, whatever the CPU does."""
    store = tmp_path_factory.mktemp("paced-store")
    done = toy_model.add_toy(store, tmp_path_factory.mktemp("paced"), PACED, "toyscore.tasks:PacedScore",
                             "--set", "pace_batch_s=0.1", "--set", "pace_item_s=0.025", "--batch-size", "4")
    assert done.returncode == 0, done.stderr
    env = {"PYTHONPATH": str(toy_model.PACKAGE_DIR)}
    with Stack(model_store=store, models=[PACED], log_dir=tmp_path_factory.mktemp("paced-logs"),
               worker_env={**env, "FUNNEL_HEARTBEAT_TTL_S": "3"},
               web_env={**env, "FUNNEL_REQUEST_TIMEOUT_S": "10"}) as running:
        yield running


def test_four_times_capacity_of_a_paced_model_is_shed_by_predicted_wait(paced_stack):
    run = overload(paced_stack, poster(paced_stack, PACED, json.dumps({"input": [0.5, -1, 2, 0]}).encode(),
                                       "application/json"), "paced toy model", DURATION_S)
    print("\n" + run.summary())
    outcome = Outcome()
    for status, seconds, *_ in run.results:
        outcome.add(status, seconds)
    FAULT_TABLE.append((f"4x capacity, {run.label} ({run.offered:.0f} req/s offered for {DURATION_S:g} s)", outcome, 0))
    assert not run.problems(), run.problems()

