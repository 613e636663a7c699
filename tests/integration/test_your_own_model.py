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

from funnel_client import BadRequest, Client
from tests import toy_model
from tests.support import ROOT, http
from tests.toy_model import LABELS, expected_scores, funnel

NAME = "toy-score"
RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def outside_env() -> dict:
    return toy_model.outside_env()


@pytest.fixture(scope="module")
def store(model_store, tmp_path_factory, outside_env) -> Path:
    store = tmp_path_factory.mktemp("store")
    for name in ("image-classifier", "text-embedding"):
        (store / name).symlink_to(model_store / name, target_is_directory=True)
    done = toy_model.add_toy(store, tmp_path_factory.mktemp("toy"), NAME, "toyscore.tasks:VectorScore",
                             "--batch-size", "8", "--description", "a toy scorer")
    assert done.returncode == 0, done.stderr
    assert "VectorScore, input kind json" in done.stdout
    return store


@pytest.fixture(scope="module")
def stack(store):
    with toy_model.outside_stack(store) as running:
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
