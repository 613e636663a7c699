"""/v2 answers: the items' rows of an output as one tensor, padded where their shapes differ.

A variable-length output whose items ran in different batches (or in different
runs of one batch) comes back with rows of different shapes; they are padded
with zeros to the largest size on each axis, and the output's parameters say
so. Rows of different ranks are the model's fault: a 500 that says why.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import orjson
import pytest

from funnel.common.contracts.wire import Reply
from funnel.common.errors import InferenceFailed
from funnel.web import errors
from funnel.web.pipeline import Answered, Work
from funnel.web.protocols.tensors import stack_rows
from funnel.web.protocols.v2 import V2, Wanted, outputs_of

LABELS = ("a", "b", "c", "d", "e")
TASK = SimpleNamespace(class_labels=lambda: LABELS)


def replies(*rows) -> list[Reply]:
    return [Reply(id=str(i), ok=True, outputs={"out": np.asarray(row, np.float32)}) for i, row in enumerate(rows)]


def test_rows_of_one_shape_are_stacked_without_parameters():
    outputs, chunks = outputs_of(TASK, [("out", False, 0)], replies([1, 2], [3, 4]))  # type: ignore[arg-type]
    assert outputs == [{"name": "out", "datatype": "FP32", "shape": [2, 2], "data": outputs[0]["data"]}]
    assert outputs[0]["data"].tolist() == [1, 2, 3, 4] and not chunks


def test_ragged_rows_are_padded_and_say_their_own_shapes():
    outputs, _ = outputs_of(TASK, [("out", False, 0)], replies([1], [1, 2, 3], [4, 5]))  # type: ignore[arg-type]
    entry = outputs[0]
    assert entry["shape"] == [3, 3]
    assert entry["data"].tolist() == [1, 0, 0, 1, 2, 3, 4, 5, 0]
    assert entry["parameters"] == {"padded": True, "row_shapes": [[1], [3], [2]]}


def test_ragged_rows_pad_every_axis_to_its_largest():
    a, b = np.arange(6).reshape(2, 3), np.arange(4).reshape(4, 1) + 10
    value, parameters = stack_rows("out", [a.astype(np.float32), b.astype(np.float32)])
    assert value.shape == (2, 4, 3) and parameters["row_shapes"] == [[2, 3], [4, 1]]
    assert value[0, :2].tolist() == a.tolist() and not value[0, 2:].any()
    assert value[1, :, 0].tolist() == [10, 11, 12, 13] and not value[1, :, 1:].any()


def test_padded_binary_output_keeps_both_parameters():
    outputs, chunks = outputs_of(TASK, [("out", True, 0)], replies([1, 2], [3]))  # type: ignore[arg-type]
    assert outputs[0]["parameters"] == {"padded": True, "row_shapes": [[2], [1]], "binary_data_size": 16}
    assert np.frombuffer(chunks[0], "<f4").tolist() == [1, 2, 3, 0]


def test_classification_ranks_each_ragged_row_on_its_own_values():
    # Padding would rank a zero above the second row's negative scores: it must not.
    outputs, _ = outputs_of(TASK, [("out", False, 2)],  # type: ignore[arg-type]
                            replies([0.1, 0.7, 0.2], [-1.0, -3.0], [-5.0, -2.0, -4.0, -1.0]))
    entry = outputs[0]
    assert entry["shape"] == [3, 2] and "parameters" not in entry
    assert entry["data"] == ["0.700000:1:b", "0.200000:2:c", "-1.000000:0:a", "-3.000000:1:b",
                             "-1.000000:3:d", "-2.000000:1:b"]


def test_classification_asks_no_more_classes_than_the_shortest_row_has():
    outputs, _ = outputs_of(TASK, [("out", True, 5)], replies([1, 2, 3], [4]))  # type: ignore[arg-type]
    assert outputs[0]["shape"] == [2, 1]


def test_rows_of_different_ranks_are_a_500_that_says_why():
    with pytest.raises(InferenceFailed) as caught:
        outputs_of(TASK, [("out", False, 0)], replies([1, 2], [[1, 2]]))  # type: ignore[arg-type]
    assert caught.value.status == 500
    assert "'out'" in caught.value.message and "[2] and [1, 2]" in caught.value.message
    status, body, _ = V2(8).render_error(caught.value, SimpleNamespace())  # type: ignore[arg-type]
    assert status == 500 and "different ranks" in orjson.loads(body)["error"]
    assert errors.expected(caught.value)  # answered without a traceback in the log


def test_a_whole_answer_with_a_padded_output_reads_back():
    task = SimpleNamespace(spec=SimpleNamespace(name="toy", version=1), class_labels=lambda: None)
    work = Work([], Wanted([("out", True, 0)], "r1"))
    answered = Answered(replies([1, 2, 3], [4]), [], "normal")  # type: ignore[arg-type]
    body, headers = V2(8).render(task, work, answered)  # type: ignore[arg-type]
    size = int(dict(headers)["Inference-Header-Content-Length"])
    head = orjson.loads(body[:size])
    assert head["outputs"][0]["parameters"]["row_shapes"] == [[3], [1]]
    values = struct.unpack("<6f", body[size:])
    assert values == (1, 2, 3, 4, 0, 0)
