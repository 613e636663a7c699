"""The Open Inference Protocol over gRPC (`funnel-grpc`), driven by the stock tritonclient[grpc] package.

Every answer is compared with /v1's for the same inputs: the same embeddings, the same top classes.
tritonclient sends its tensors in raw_input_contents; the typed `contents` form is sent through the
protocol's own messages (tritonclient's generated service_pb2), as other clients send it.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from tests.support import SENTENCES, http

TEXT, IMAGE = "text-embedding", "image-classifier"
KEY = "grpc-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
EIGHT = [f"{sentence} ({i})" for i, sentence in enumerate(SENTENCES * 2)]


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, grpc_port=free_port(), web_env={"FUNNEL_API_KEYS": KEY},
               log_dir=tmp_path_factory.mktemp("grpc")) as running:
        yield running


@pytest.fixture(scope="module")
def triton(stack):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(stack):
    with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def v1(stack, model: str, **request) -> dict:
    status, body, _ = http("POST", f"{stack.url}/v1/models/{model}/predict",
                           headers={"Authorization": f"Bearer {KEY}", **request.pop("headers", {})}, **request)
    assert status == 200, body
    return body


def v1_embeddings(stack, texts: list[str]) -> np.ndarray:
    return np.array([r["embedding"] for r in v1(stack, TEXT, json_body={"texts": texts})["results"]], np.float32)


def text_input(texts: list[str]):
    tensor = grpcclient.InferInput("TEXT", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    return tensor


def image_input(images: list[bytes]):
    tensor = grpcclient.InferInput("IMAGE", [len(images)], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=object))
    return tensor


def test_health_is_open_and_the_rest_needs_the_key(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready(TEXT, headers=AUTH) and triton.is_model_ready(IMAGE, "1", headers=AUTH)
    with pytest.raises(InferenceServerException) as refused:
        triton.get_model_metadata(TEXT)
    assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException) as refused:
        triton.infer(TEXT, [text_input(["hello"])], headers={"authorization": "Bearer wrong"})
    assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException) as unknown:
        triton.is_model_ready("no-such-model", headers=AUTH)
    assert unknown.value.status() == "StatusCode.NOT_FOUND"


def test_metadata_states_inputs_and_outputs(triton):
    server = triton.get_server_metadata(headers=AUTH, as_json=True)
    assert server["name"] == "funnel" and set(server["extensions"]) == {"classification", "binary_tensor_data",
                                                                   "model_configuration", "statistics"}
    text = triton.get_model_metadata(TEXT, headers=AUTH, as_json=True)
    assert text["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": ["-1", "1"]}]
    assert text["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": ["-1", "384"]}]
    image = triton.get_model_metadata(IMAGE, "1", headers=AUTH, as_json=True)
    assert {"name": "pixels", "datatype": "UINT8", "shape": ["-1", "224", "224", "3"]} in image["inputs"]
    assert image["versions"] == ["1"] and image["platform"] == "funnel_image_classification"


@pytest.mark.parametrize("texts", [SENTENCES[:1], EIGHT], ids=["batch-1", "batch-8"])
def test_text_embeddings_equal_v1s(stack, triton, texts):
    result = triton.infer(TEXT, [text_input(texts)], headers=AUTH, request_id="req-7")
    embeddings = result.as_numpy("embedding")
    assert embeddings.shape == (len(texts), 384) and embeddings.dtype == np.float32
    np.testing.assert_allclose(embeddings, v1_embeddings(stack, texts), atol=1e-5)
    response = result.get_response()
    assert response.id == "req-7" and response.model_version == "1" and len(response.raw_output_contents) == 1


@pytest.mark.parametrize("n", [1, 8])
def test_images_classified_as_v1_does(stack, triton, cat_jpeg, coffee_jpeg, n):
    images = ([cat_jpeg, coffee_jpeg] * 4)[:n]
    probabilities = triton.infer(IMAGE, [image_input(images)], headers=AUTH).as_numpy("probabilities")
    assert probabilities.shape == (n, 1000)
    for image, row in zip(images, probabilities):
        top = v1(stack, IMAGE, body=image, headers={"Content-Type": "image/jpeg"})["predictions"]
        assert list(np.argsort(-row)[:3]) == [p["index"] for p in top[:3]]
        assert row[top[0]["index"]] == pytest.approx(top[0]["probability"], abs=1e-4)


def test_classification_answers_tritons_strings(stack, triton, cat_jpeg):
    wanted = grpcclient.InferRequestedOutput("probabilities", class_count=3)
    classes = triton.infer(IMAGE, [image_input([cat_jpeg])], outputs=[wanted], headers=AUTH).as_numpy("probabilities")
    top = v1(stack, IMAGE, body=cat_jpeg, headers={"Content-Type": "image/jpeg"})["predictions"]
    assert classes.shape == (1, 3)
    assert [c.decode().split(":", 2)[1:] for c in classes[0]] == [[str(p["index"]), p["label"]] for p in top[:3]]


def test_ready_pixels_in_raw_contents(stack, triton, cat_jpeg):
    from funnel.common import tasks
    from funnel.common.store import load_spec

    pixels = tasks.load(load_spec(stack.model_store, IMAGE)).preprocess(cat_jpeg)["pixels"]
    tensor = grpcclient.InferInput("pixels", [2, 224, 224, 3], "UINT8")
    tensor.set_data_from_numpy(np.stack([pixels, pixels]))
    probabilities = triton.infer(IMAGE, [tensor], headers=AUTH).as_numpy("probabilities")
    encoded = triton.infer(IMAGE, [image_input([cat_jpeg])], headers=AUTH).as_numpy("probabilities")
    np.testing.assert_allclose(probabilities, np.repeat(encoded, 2, axis=0), atol=1e-5)


def test_typed_contents_as_well_as_raw(stack, stub):
    """The other form the protocol allows: each element in the datatype's repeated field."""
    tensor = service_pb2.ModelInferRequest().InferInputTensor(name="TEXT", datatype="BYTES", shape=[2])
    tensor.contents.bytes_contents.extend([s.encode() for s in SENTENCES[:2]])
    request = service_pb2.ModelInferRequest(model_name=TEXT, inputs=[tensor])
    response = stub.ModelInfer(request, metadata=tuple(AUTH.items()), timeout=30)
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("embedding", "FP32", [2, 384])
    embeddings = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 384)
    np.testing.assert_allclose(embeddings, v1_embeddings(stack, SENTENCES[:2]), atol=1e-5)

