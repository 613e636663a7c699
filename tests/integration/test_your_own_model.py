"""A third model from a package outside Funnel, served end to end with no change to Funnel's source.

tests/third_party/toyscore holds the task; this test builds its ONNX graph,
adds it to a fresh store with `funnel add`, and serves it with the two
shipped models through the same API, page and client as theirs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from funnel.scripts.stack import Stack
from funnel_client import BadRequest, Client
from tests.conftest import ROOT, http

PACKAGE_DIR = ROOT / "tests" / "third_party"
NAME = "toy-score"
LABELS = ["low", "middle", "high"]
RNG = np.random.default_rng(7)
WEIGHTS = RNG.normal(size=(4, 3)).astype(np.float32)
BIAS = np.array([0.1, -0.2, 0.05], np.float32)


def expected_scores(vectors: np.ndarray) -> np.ndarray:
    logits = vectors.astype(np.float32) @ WEIGHTS + BIAS
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def write_graph(path: Path) -> None:
    """scores = softmax(vectors @ W + b), with a dynamic batch axis."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["vectors", "W"], ["product"]),
         helper.make_node("Add", ["product", "b"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["scores"], axis=1)],
        "toy-score",
        [helper.make_tensor_value_info("vectors", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(WEIGHTS, "W"), numpy_helper.from_array(BIAS, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def funnel(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "funnel"), *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def outside_env() -> dict:
    """The environment of a user whose package is importable: only PYTHONPATH names it."""
    return {**os.environ, "PYTHONPATH": str(PACKAGE_DIR)}


@pytest.fixture(scope="module")
def store(model_store, tmp_path_factory, outside_env) -> Path:
    store = tmp_path_factory.mktemp("store")
    for name in ("image-classifier", "text-embedding"):
        (store / name).symlink_to(model_store / name, target_is_directory=True)
    work = tmp_path_factory.mktemp("toy")
    write_graph(work / "toy.onnx")
    (work / "classes.txt").write_text("\n".join(LABELS) + "\n")
    done = funnel("add", NAME, "--store", str(store), "--task", "toyscore.tasks:VectorScore",
                  "--onnx", str(work / "toy.onnx"), "--file", f"labels={work / 'classes.txt'}",
                  "--set", "dim=4", "--batch-size", "8", "--description", "a toy scorer", env=outside_env)
    assert done.returncode == 0, done.stderr
    assert "VectorScore, input kind json" in done.stdout
    return store


@pytest.fixture(scope="module")
def stack(store, outside_env):
    env = {"PYTHONPATH": outside_env["PYTHONPATH"]}
    with Stack(model_store=store, web_env=env, worker_env=env) as running:
        yield running


def test_add_refuses_a_task_it_cannot_import(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"")
    done = funnel("add", "x", "--store", str(tmp_path), "--task", "nowhere.tasks:Thing",
                  "--onnx", str(tmp_path / "m.onnx"), env=dict(os.environ))
    assert done.returncode != 0 and "cannot be imported" in done.stderr
    assert not (tmp_path / "x").exists()


def test_listed_with_its_input_kind_and_own_fields(stack):
    status, body, _ = http("GET", f"{stack.url}/v1/models/{NAME}")
    assert status == 200, body
    assert body["task"] == "toyscore.tasks:VectorScore" and body["input_kind"] == "json"
    assert body["dim"] == 4 and body["labels"] == LABELS and body["limits"] == {"max_abs": 1_000_000}
    assert body["description"] == "a toy scorer" and body["batch_size"] == 8 and body["workers"]


def test_one_and_many_inputs_answer_what_numpy_computes(stack):
    vectors = RNG.normal(size=(6, 4)).round(3)
    with Client(stack.url) as client:
        one = client.predict(NAME, input=vectors[0].tolist())
        many = client.predict(NAME, inputs=vectors.tolist())
    want = expected_scores(vectors)
    np.testing.assert_allclose(one["scores"], want[0], atol=1e-5)
    assert one["label"] == LABELS[int(want[0].argmax())] and one["meta"]["worker"]
    assert len(many["results"]) == 6
    for got, row in zip(many["results"], want):
        np.testing.assert_allclose(got["scores"], row, atol=1e-5)


def test_the_task_refuses_bad_inputs_with_its_own_message(stack):
    with Client(stack.url) as client:
        for bad in ([1, 2, 3], ["a", 1, 2, 3], [1e9, 0, 0, 0]):
            with pytest.raises(BadRequest) as err:
                client.predict(NAME, input=bad)
            assert err.value.code == "bad_vector"


def test_the_shipped_models_still_answer_beside_it(stack):
    with Client(stack.url) as client:
        assert len(client.predict("text-embedding", text="A man is eating food.")["embedding"]) == 384


def test_the_page_offers_a_json_form(stack):
    status, body, _ = http("GET", f"{stack.url}/")
    page = body["_text"]
    assert status == 200 and f'data-model="{NAME}"' in page
    assert 'data-kind="json"' in page and 'class="json-form"' in page


def test_the_cli_sends_json_inputs(stack):
    done = subprocess.run([str(Path(sys.executable).parent / "funnel-client"), "--url", stack.url,
                           "--model", NAME, "--input", "[1, 2, 3, 4]", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"label"' in done.stdout


def test_funnel_source_knows_nothing_of_it():
    for folder in ("common", "web", "worker"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".html", ".js", ".json"):
                assert "toyscore" not in path.read_text() and NAME not in path.read_text(), path
