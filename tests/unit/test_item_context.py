"""An item's context from preprocess to postprocess: checked in the web tier, carried beside the item,
handed to postprocess only (never to collate, never in a raw reply), and nothing for a task without."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import CONTEXT_FORMAT, Job, decode_job, encode_job
from funnel.common.errors import FunnelError, Unavailable
from funnel.common.store import ModelSpec
from funnel.common.tasks import Task, WithContext
from funnel.web.pipeline import Inference, Pipeline, arrays_and_contexts, carried
from funnel.web.queueing.shedding import Capacity
from funnel.worker import batch as batching

SPEC = ModelSpec(name="m", task="tests:Scaled", path=None, batch_size=8, config={})  # type: ignore[arg-type]
KEYS = Keys()


class Scaled(Task):
    """x in, x * 2 out; the item's context, when it keeps one, scales the result back."""

    input_kind = "json"
    collated: list[list[str]] = []

    def preprocess(self, item: Any):
        inputs = {"x": np.array([item["x"]], np.float32)}
        return WithContext(inputs, item["context"]) if "context" in item else inputs

    def check(self, inputs):
        pass

    def collate(self, items):
        self.collated.append(sorted({name for item in items for name in item}))
        return {"x": np.stack([item["x"] for item in items])}

    def postprocess(self, row, context=None):
        if context is None:
            return {"y": float(row["y"][0])}
        return {"y": float(row["y"][0]) / context["scale"], "seen": context}


class RowOnly(Scaled):
    def postprocess(self, row):  # type: ignore[override]  # a task from before contexts
        return {"y": float(row["y"][0])}


class Doubling:
    def run(self, feeds):
        return [{"y": y} for y in feeds["x"] * 2]


def prepared(task, items):
    return arrays_and_contexts(Pipeline.prepare(object.__new__(Pipeline), task, items))


def test_a_task_without_contexts_makes_jobs_without():
    inputs, contexts = prepared(Scaled(SPEC), [{"x": 1}, {"x": 2}])
    assert contexts is None and [float(i["x"][0]) for i in inputs] == [1, 2]


def test_contexts_travel_beside_their_items_and_reach_postprocess_only():
    task = Scaled(SPEC)
    inputs, contexts = prepared(task, [{"x": 1, "context": {"scale": 4}}, {"x": 3}, {"x": 5, "context": {"scale": 2}}])
    assert contexts == [{"scale": 4}, None, {"scale": 2}]
    jobs = [encode_job(Job(id=f"j{i}", model="m", items=inputs[i:i + 2], reply_to=KEYS.reply("m", "w"),
                           deadline=2 ** 41, contexts=contexts[i:i + 2])) for i in (0, 2)]
    Scaled.collated.clear()
    batch = batching.prepare(jobs, task, "m", KEYS, "w")
    batching.run(batch, task, Doubling())  # type: ignore[arg-type]
    batching.finish(batch, task, "w")
    assert Scaled.collated == [["x"]]  # the model's feeds: the arrays alone, one run of the three items
    (first, second) = [reply for _, reply in batch.replies]
    assert first.items == [{"y": 0.5, "seen": {"scale": 4}}, {"y": 6.0}]
    assert second.outputs == {"y": 5.0, "seen": {"scale": 2}}


def test_a_task_from_before_contexts_is_called_with_the_row_alone():
    task = RowOnly(SPEC)
    inputs, _ = prepared(task, [{"x": 1}])
    batch = batching.prepare([encode_job(Job(id="j", model="m", items=inputs, reply_to=KEYS.reply("m", "w"),
                                             deadline=2 ** 41))], task, "m", KEYS, "w")
    batching.run(batch, task, Doubling())  # type: ignore[arg-type]
    batching.finish(batch, task, "w")
    assert batch.replies[0][1].outputs == {"y": 2.0}


@pytest.mark.parametrize("context, says", [
    ({"scale": np.float32(2)}, "not float32"),
    ({"pixels": np.zeros(3)}, "not ndarray"),
    ({"blob": "x" * 70_000}, "exceeds"),
    ([1, 2], "a context is a map"),
])
def test_a_context_the_wire_cannot_carry_is_the_task_s_fault_naming_the_item(context, says):
    with pytest.raises(FunnelError) as err:
        prepared(Scaled(SPEC), [{"x": 1}, {"x": 2, "context": context}])
    assert err.value.status == 500 and err.value.code == "bad_context"
    assert err.value.message.startswith("item 1: tests:Scaled: ") and says in err.value.message


def test_a_recovered_job_keeps_its_items_contexts():
    job = Job(id="j", model="m", items=[{"x": np.ones(1, np.float32)}], reply_to="r", deadline=1,
              contexts=[{"size": [640, 480]}])
    again = decode_job(encode_job(decode_job(encode_job(job))))
    assert again.contexts == [{"size": [640, 480]}]


def test_contexts_are_refused_while_a_worker_that_would_drop_them_serves():
    """A live worker of a job format before contexts would run the items and drop their contexts: 503
    instead of a silently wrong answer; raw rows (no postprocess) and items without contexts still go."""
    contexts = [{"scale": 2.0}, None]
    old = Capacity(("old-worker",), job_format=CONTEXT_FORMAT - 1)

    def request(contexts: list | None, raw: bool = False) -> Inference:
        return Inference(model="m", version=1, items=[{}, {}], deadline=0, contexts=contexts, raw=raw)

    with pytest.raises(Unavailable, match="drops item contexts") as refused:
        carried(request(contexts), old)
    assert refused.value.status == 503 and refused.value.code == "no_worker"
    assert carried(request(contexts, raw=True), old) is None  # raw rows read no context
    assert carried(request(None), old) is None
    assert carried(request(contexts), Capacity(("new-worker",))) == contexts
    assert carried(request(contexts), Capacity(())) == contexts  # held for a worker to come
