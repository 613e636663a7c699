"""Models from outside on /v2, served by a real stack: a variable-length output, and ready tensors.

The models are toyscore's (tests/third_party/toyscore), added with `funnel add`
as an outside user would. The scalers take a list of numbers and double each:
the worker's collate pads a run to its widest list, so an item's row is as wide
as its run's widest input. Items that run in different batches (ScaledList,
batch size 4), or in different runs of one batch (ScaledByWidth, whose
buckets() runs every width apart), come back with rows of different widths,
which /v2 pads with zeros and describes in the output's parameters. The scorer,
added with model.json's "inputs", takes its vectors as ready FP32 tensors.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from funnel.scripts.stack import Stack
from tests import toy_model
from tests.support import http
from tests.toy_model import SCALE, expected_scores

BY_BATCH, BY_WIDTH, READY = "toy-scaled", "toy-scaled-by-width", "toy-score-ready"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    work = tmp_path_factory.mktemp("toy")
    toy_model.add_scaled(store, work, BY_BATCH, "toyscore.tasks:ScaledList", 4)
    toy_model.add_scaled(store, work, BY_WIDTH, "toyscore.tasks:ScaledByWidth", 8)
    done = toy_model.add_toy(store, work, READY, "toyscore.tasks:VectorScore",
                             "--set", 'inputs={"vector": {"dtype": "float32", "shape": [4]}}')
    assert done.returncode == 0, done.stderr
    env = {"PYTHONPATH": toy_model.outside_env()["PYTHONPATH"]}
    with Stack(model_store=store, web_env=env, worker_env=env) as running:
        yield running


def lists(*widths: int, sign: float = 1.0) -> list[list[float]]:
    """Lists of the given widths, each value distinct and exact in float32."""
    return [[sign * (10 * i + j + 1) for j in range(width)] for i, width in enumerate(widths)]


def infer(stack, model: str, items: list[list[float]], outputs: list[dict] | None = None) -> tuple[int, dict]:
    body: dict = {"inputs": [{"name": "JSON", "datatype": "BYTES", "shape": [len(items)],
                              "data": [json.dumps(item) for item in items]}]}
    if outputs is not None:
        body["outputs"] = outputs
    status, answer, _ = http("POST", f"{stack.url}/v2/models/{model}/infer", json_body=body)
    return status, answer


def rows_of(output: dict) -> np.ndarray:
    return np.asarray(output["data"], np.float32).reshape(output["shape"])


def check_rows(rows: np.ndarray, items: list[list[float]], widths: list[int]) -> None:
    """Each row: its item doubled, then the worker's padding up to its run's width, then the answer's."""
    for row, item, width in zip(rows, items, widths):
        assert width >= len(item)
        np.testing.assert_array_equal(row[:len(item)], SCALE * np.asarray(item, np.float32))
        assert not row[len(item):].any()


def test_items_in_different_batches_come_back_padded_to_the_widest(stack):
    items = lists(1, 2, 3, 4, 5, 6, 7)  # 7 items, batches of at most 4: at least two batches
    status, answer = infer(stack, BY_BATCH, items)
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["name"] == "scaled" and output["datatype"] == "FP32" and output["shape"] == [7, 7]
    parameters = output["parameters"]
    assert parameters["padded"] is True
    widths = [shape[0] for shape in parameters["row_shapes"]]
    assert all(len(shape) == 1 for shape in parameters["row_shapes"])
    assert len(set(widths)) >= 2 and max(widths) == 7  # each batch padded to its own widest
    check_rows(rows_of(output), items, widths)


def test_items_in_one_batch_come_back_stacked_as_they_ran(stack):
    items = lists(2, 5, 3)  # one batch: every row padded by the worker to 5, nothing left to pad
    status, answer = infer(stack, BY_BATCH, items)
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["shape"] == [3, 5] and "parameters" not in output
    check_rows(rows_of(output), items, [5, 5, 5])


def test_buckets_make_rows_of_one_batch_as_wide_as_their_inputs(stack):
    items = lists(3, 1, 3, 2, sign=-1.0)
    status, answer = infer(stack, BY_WIDTH, items)
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["shape"] == [4, 3]
    assert output["parameters"] == {"padded": True, "row_shapes": [[3], [1], [3], [2]]}
    check_rows(rows_of(output), items, [3, 1, 3, 2])
    # The same items on /v1 run in one batch of 4, each answered exactly as wide as its list.
    status, body, _ = http("POST", f"{stack.url}/v1/models/{BY_WIDTH}/predict", json_body={"inputs": items})
    assert status == 200, body
    assert [r["values"] for r in body["results"]] == [[SCALE * x for x in item] for item in items]
    assert [m["batch_size"] for m in body["meta"]] == [4, 4, 4, 4]


def test_classification_ranks_each_ragged_row_on_its_own_values(stack):
    items = lists(3, 2, 4, sign=-1.0)  # all negative: a padded zero would top every short row
    status, answer = infer(stack, BY_WIDTH, items, [{"name": "scaled", "parameters": {"classification": 2}}])
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["shape"] == [3, 2] and output["datatype"] == "BYTES"
    assert output["data"] == [f"{SCALE * -1:f}:0", f"{SCALE * -2:f}:1", f"{SCALE * -11:f}:0",
                              f"{SCALE * -12:f}:1", f"{SCALE * -21:f}:0", f"{SCALE * -22:f}:1"]


def test_a_triton_client_reads_a_padded_binary_output(stack):
    import tritonclient.http as httpclient
    client = httpclient.InferenceServerClient(url=stack.url.removeprefix("http://"))
    try:
        items = lists(2, 4, 1)
        given = httpclient.InferInput("JSON", [3], "BYTES")
        given.set_data_from_numpy(np.array([json.dumps(i).encode() for i in items], dtype=object))
        result = client.infer(BY_WIDTH, [given], outputs=[httpclient.InferRequestedOutput("scaled", binary_data=True)])
        rows = result.as_numpy("scaled")
        parameters = result.get_output("scaled")["parameters"]
    finally:
        client.close()
    assert rows.shape == (3, 4) and rows.dtype == np.float32
    assert parameters["padded"] is True and parameters["row_shapes"] == [[2], [4], [1]]
    check_rows(rows, items, [2, 4, 1])


def test_model_json_inputs_are_taken_as_ready_tensors(stack):
    status, meta, _ = http("GET", f"{stack.url}/v2/models/{READY}")
    assert status == 200, meta
    assert {"name": "vector", "datatype": "FP32", "shape": [-1, 4]} in meta["inputs"]
    vectors = np.asarray(toy_model.vectors(3), np.float32)
    body = {"inputs": [{"name": "vector", "datatype": "FP32", "shape": [3, 4], "data": vectors.ravel().tolist()}]}
    status, answer, _ = http("POST", f"{stack.url}/v2/models/{READY}/infer", json_body=body)
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["shape"] == [3, 3] and "parameters" not in output
    np.testing.assert_allclose(rows_of(output), expected_scores(vectors), atol=1e-6)
    body["inputs"][0].update(shape=[2, 6])  # 12 numbers, the wrong shape: a 400 naming the input
    status, answer, _ = http("POST", f"{stack.url}/v2/models/{READY}/infer", json_body=body)
    assert status == 400 and "'vector'" in answer["error"] and "FP32 [-1, 4]" in answer["error"]
