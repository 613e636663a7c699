"""/v2, the Open Inference Protocol, driven by the stock tritonclient[http] package against a live stack.

Every answer is compared with /v1's for the same inputs: same embeddings, same top-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from funnel.scripts.stack import Stack
from tests.support import SENTENCES, http, jpeg_bytes

TEXT, IMAGE = "text-embedding", "image-classifier"


@pytest.fixture(scope="module")
def stack(model_store):
    with Stack(model_store=model_store) as running:
        yield running


@pytest.fixture(scope="module")
def triton(stack):
    client = httpclient.InferenceServerClient(url=stack.url.removeprefix("http://"))
    yield client
    client.close()


def v1_embeddings(stack, texts):
    status, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"texts": texts})
    assert status == 200, body
    return np.array([r["embedding"] for r in body["results"]], np.float32)


def v1_top5(stack, image: bytes) -> list[int]:
    status, body, _ = http("POST", f"{stack.url}/v1/models/{IMAGE}/predict", body=image,
                           headers={"Content-Type": "image/jpeg"})
    assert status == 200, body
    return [p["index"] for p in body["predictions"]]


def test_server_and_model_probes(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready(TEXT) and triton.is_model_ready(IMAGE, model_version="1")
    assert not triton.is_model_ready("no-such-model")
    server = triton.get_server_metadata()
    assert server["name"] == "funnel" and "binary_tensor_data" in server["extensions"]


def test_metadata_states_inputs_and_outputs(triton):
    text = triton.get_model_metadata(TEXT)
    assert text["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    assert text["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    image = triton.get_model_metadata(IMAGE, model_version="1")
    assert {"name": "pixels", "datatype": "UINT8", "shape": [-1, 224, 224, 3]} in image["inputs"]
    assert image["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 1000]}]
    with pytest.raises(InferenceServerException):
        triton.get_model_metadata(TEXT, model_version="7")


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("n", [1, 8])
def test_text_embeddings_equal_v1(stack, triton, binary, n):
    texts = (SENTENCES * 2)[:n]
    given = httpclient.InferInput("TEXT", [n], "BYTES")
    given.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary_data=binary)
    wanted = httpclient.InferRequestedOutput("embedding", binary_data=binary)
    result = triton.infer(TEXT, [given], outputs=[wanted])
    embeddings = result.as_numpy("embedding")
    assert embeddings.shape == (n, 384) and embeddings.dtype == np.float32
    np.testing.assert_allclose(embeddings, v1_embeddings(stack, texts), atol=1e-6)


def test_binary_output_by_default(stack, triton):
    given = httpclient.InferInput("TEXT", [1], "BYTES")
    given.set_data_from_numpy(np.array([SENTENCES[0].encode()], dtype=object))
    result = triton.infer(TEXT, [given])  # no outputs named: every output, as binary data
    assert result.get_output("embedding")["parameters"]["binary_data_size"] == 384 * 4
    np.testing.assert_allclose(result.as_numpy("embedding")[0], v1_embeddings(stack, SENTENCES[:1])[0], atol=1e-6)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("n", [1, 8])
def test_encoded_images_and_classification_equal_v1(stack, triton, cat_jpeg, coffee_jpeg, binary, n):
    """Images go as binary data (JSON carries BYTES only as UTF-8 strings); the answer either way."""
    images = ([cat_jpeg, coffee_jpeg] * 4)[:n]
    given = httpclient.InferInput("IMAGE", [n], "BYTES")
    given.set_data_from_numpy(np.array(images, dtype=object), binary_data=True)
    outputs = [httpclient.InferRequestedOutput("probabilities", binary_data=binary, class_count=5)]
    result = triton.infer(IMAGE, [given], outputs=outputs)
    top = result.as_numpy("probabilities")
    assert top.shape == (n, 5)
    first = top[0][0].decode() if isinstance(top[0][0], bytes) else top[0][0]
    score, index, label = first.split(":", 2)
    assert int(index) == 285 and label == "Egyptian cat" and 0 < float(score) <= 1
    for row, image in zip(top, images):
        indexes = [int((c.decode() if isinstance(c, bytes) else c).split(":")[1]) for c in row]
        assert indexes == v1_top5(stack, image)


@pytest.mark.parametrize("binary", [True, False])
def test_ready_pixels_give_the_probabilities(stack, triton, cat_jpeg, binary):
    import io

    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(cat_jpeg)).convert("RGB").resize((224, 224)), np.uint8)
    batch = np.stack([pixels, pixels[::-1]])
    given = httpclient.InferInput("pixels", list(batch.shape), "UINT8")
    given.set_data_from_numpy(batch, binary_data=binary)
    result = triton.infer(IMAGE, [given], outputs=[httpclient.InferRequestedOutput("probabilities",
                                                                                      binary_data=binary)])
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (2, 1000)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, atol=1e-4)
    assert probabilities[0].argmax() in (281, 282, 285)  # a cat, from the pixels as sent


def test_errors_name_the_input_and_take_the_protocol_shape(stack, triton):
    given = httpclient.InferInput("pixels", [1, 10, 10, 3], "UINT8")
    given.set_data_from_numpy(np.zeros((1, 10, 10, 3), np.uint8))
    with pytest.raises(InferenceServerException, match="pixels"):
        triton.infer(IMAGE, [given])
    status, body, _ = http("POST", f"{stack.url}/v2/models/{TEXT}/infer",
                           json_body={"inputs": [{"name": "WORDS", "datatype": "BYTES", "shape": [1],
                                                  "data": ["x"]}]})
    assert status == 400 and isinstance(body["error"], str) and "WORDS" in body["error"]


def test_the_api_key_is_asked_for_infer_not_for_health(model_store):
    with Stack(model_store=model_store, models=[TEXT], web_env={"FUNNEL_API_KEYS": "k1"}) as keyed:
        url = keyed.url.removeprefix("http://")
        plain = httpclient.InferenceServerClient(url=url)
        assert plain.is_server_live()
        given = httpclient.InferInput("TEXT", [1], "BYTES")
        given.set_data_from_numpy(np.array([b"hello"], dtype=object))
        with pytest.raises(InferenceServerException):
            plain.infer(TEXT, [given])
        result = plain.infer(TEXT, [given], headers={"Authorization": "Bearer k1"})
        assert result.as_numpy("embedding").shape == (1, 384)
        plain.close()


def test_jpeg_helper_is_a_jpeg():
    assert jpeg_bytes(np.zeros((8, 8, 3), np.uint8))[:2] == b"\xff\xd8"
