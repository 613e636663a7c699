"""POST /v1/embeddings and GET /v1/models, driven by OpenAI's own Python client against a live stack.

Every embedding is compared with /v1's predict for the same text, and usage with the model's own
tokenizer; the errors are OpenAI's shapes and statuses, as its client raises them.
"""

from __future__ import annotations

import base64

import numpy as np
import openai  # noqa: E402
import pytest

from funnel.common import tasks
from funnel.common.store import load_spec
from funnel.scripts.stack import Stack
from tests.support import SENTENCES, http

TEXT, IMAGE = "text-embedding", "image-classifier"
KEY = "openai-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    """Both models served (the image model is not an embedding model), a worker for the text one."""
    with Stack(model_store=model_store, workers=[TEXT], web_env={"FUNNEL_API_KEYS": KEY, "FUNNEL_MAX_ITEMS": "8"},
               log_dir=tmp_path_factory.mktemp("openai")) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack):
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0) as made:
        yield made


@pytest.fixture(scope="module")
def tokens(model_store):
    task = tasks.load(load_spec(model_store, TEXT))
    return lambda texts: sum(len(task.preprocess(t)["input_ids"]) for t in texts)


def v1_embeddings(stack, texts: list[str]) -> np.ndarray:
    status, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"texts": texts},
                           headers=AUTH)
    assert status == 200, body
    return np.array([r["embedding"] for r in body["results"]], np.float32)


def test_a_string(stack, client, tokens):
    answer = client.embeddings.create(model=TEXT, input=SENTENCES[0], encoding_format="float")
    assert answer.object == "list" and answer.model == TEXT and len(answer.data) == 1
    assert answer.data[0].index == 0 and answer.data[0].object == "embedding"
    np.testing.assert_allclose(answer.data[0].embedding, v1_embeddings(stack, SENTENCES[:1])[0], atol=1e-5)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens(SENTENCES[:1])


def test_a_list_in_order(stack, client, tokens):
    answer = client.embeddings.create(model=TEXT, input=SENTENCES, encoding_format="float", user="ignored")
    assert [d.index for d in answer.data] == list(range(len(SENTENCES)))
    np.testing.assert_allclose([d.embedding for d in answer.data], v1_embeddings(stack, SENTENCES), atol=1e-5)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens(SENTENCES)


def test_base64(stack, client):
    """OpenAI's client asks for base64 unless told otherwise, and decodes it: the same floats."""
    answer = client.embeddings.create(model=TEXT, input=SENTENCES[:2])
    np.testing.assert_allclose([d.embedding for d in answer.data], v1_embeddings(stack, SENTENCES[:2]), atol=1e-5)
    status, body, _ = http("POST", f"{stack.url}/v1/embeddings", headers=AUTH,
                           json_body={"model": TEXT, "input": SENTENCES[1], "encoding_format": "base64"})
    assert status == 200, body
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, v1_embeddings(stack, SENTENCES[1:2])[0], atol=1e-5)


def test_dimensions_only_the_models_own(client):
    assert len(client.embeddings.create(model=TEXT, input="x", dimensions=384, encoding_format="float")
               .data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=TEXT, input="x", dimensions=128)
    assert refused.value.body["param"] == "dimensions"


@pytest.mark.parametrize("request_, error, param, code", [
    ({"model": "no-such-model", "input": "x"}, openai.NotFoundError, "model", "model_not_found"),
    ({"model": IMAGE, "input": "x"}, openai.BadRequestError, "model", "model_not_supported"),
    ({"model": TEXT, "input": [101, 2023, 102]}, openai.BadRequestError, "input", "token_ids_not_supported"),
    ({"model": TEXT, "input": [[101, 2023, 102]]}, openai.BadRequestError, "input", "token_ids_not_supported"),
    ({"model": TEXT, "input": ""}, openai.BadRequestError, "input", "empty_input"),
    ({"model": TEXT, "input": ["x"] * 9}, openai.BadRequestError, "input", "too_many_items"),
    ({"model": TEXT, "input": "x", "encoding_format": "int8"}, openai.BadRequestError, "encoding_format",
     "invalid_value"),
], ids=["unknown-model", "not-an-embedding-model", "token-ids", "token-id-lists", "empty", "too-many",
        "encoding"])
def test_errors_in_openais_shape(client, request_, error, param, code):
    with pytest.raises(error) as raised:
        client.embeddings.create(**request_)
    body = raised.value.body
    assert (body["type"], body["param"], body["code"]) == ("invalid_request_error", param, code)
    assert body["message"]


def test_a_wrong_key(stack):
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="wrong", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError) as refused:
            stranger.embeddings.create(model=TEXT, input="x")
    assert refused.value.status_code == 401 and refused.value.body["type"] == "authentication_error"


def test_models_list_both_shapes(stack, client):
    assert sorted(m.id for m in client.models.list()) == [IMAGE, TEXT]
    model = client.models.retrieve(TEXT)
    assert (model.id, model.object, model.owned_by) == (TEXT, "model", "funnel") and model.created > 0
    status, listing, _ = http("GET", f"{stack.url}/v1/models", headers=AUTH)
    assert status == 200 and listing["object"] == "list"
    assert {m["name"] for m in listing["models"]} == {m["id"] for m in listing["data"]} == {IMAGE, TEXT}
    assert all(set(m) == {"id", "object", "created", "owned_by"} for m in listing["data"])


def test_no_live_worker_is_a_503_to_retry(model_store, tmp_path):
    """Admission as on /v1: no worker serves the model, so a 503 at once, with Retry-After, which
    OpenAI's client raises as a server error (and would retry, were it allowed to)."""
    with Stack(model_store=model_store, models=[TEXT], workers=[], log_dir=tmp_path) as bare:
        with openai.OpenAI(base_url=f"{bare.url}/v1", api_key="none", max_retries=0) as unserved:
            with pytest.raises(openai.InternalServerError) as refused:
                unserved.embeddings.create(model=TEXT, input="x")
    error = refused.value
    assert error.status_code == 503 and int(error.response.headers["Retry-After"]) >= 1
    assert (error.body["type"], error.body["code"]) == ("server_error", "no_worker")
