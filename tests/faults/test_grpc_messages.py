"""Hostile gRPC messages: each gets the protocol's status code at once, at a bounded cost, and the
service lives on (README, failure contract).

The messages are made with the protocol's own generated classes (tritonclient's service_pb2) and
sent as they are, sizes that lie included; FUNNEL_MAX_BODY_MB is 1 here, so the largest message
the service reads is 1 MiB.
"""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
import redis
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import decode_job
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from tests.support import wait_for

TEXT, IMAGE = "text-embedding", "image-classifier"
Request = service_pb2.ModelInferRequest
Tensor = Request.InferInputTensor
BOUND_S = 1.0  # each refusal is answered within this, the message read included


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    """Both models; a worker for the text model only, so the image model has none."""
    with Stack(model_store=model_store, workers=[TEXT], grpc_port=free_port(),
               web_env={"FUNNEL_MAX_BODY_MB": "1"}, log_dir=tmp_path_factory.mktemp("grpc-hostile")) as running:
        yield running


@pytest.fixture(scope="module")
def stub(stack):
    with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}",
                               options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def text(shape, raw: bytes | None = None, **fields) -> Request:
    tensor = Tensor(name=fields.pop("name", "TEXT"), datatype=fields.pop("datatype", "BYTES"), shape=shape)
    return Request(model_name=fields.pop("model", TEXT), inputs=[tensor],
                   raw_input_contents=[raw] if raw is not None else [], **fields)


def one_text(body: bytes = b"hello") -> bytes:
    return len(body).to_bytes(4, "little") + body


def lying_pixels() -> Request:
    return Request(model_name=IMAGE, inputs=[Tensor(name="pixels", datatype="UINT8", shape=[1, 224, 224, 3])],
                   raw_input_contents=[b"\0" * 10])


def typed(datatype: str, shape: list[int], field: str, values, name: str = "pixels", model: str = IMAGE) -> Request:
    tensor = Tensor(name=name, datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return Request(model_name=model, inputs=[tensor])


HOSTILE = {
    "shape-lies-about-bytes": (text([10**12], one_text()), "INVALID_ARGUMENT"),
    "raw-shorter-than-shape": (lying_pixels(), "INVALID_ARGUMENT"),
    "bytes-length-runs-past-end": (text([1], (10**6).to_bytes(4, "little") + b"x"), "INVALID_ARGUMENT"),
    "negative-shape": (text([-1], one_text()), "INVALID_ARGUMENT"),
    "too-many-dims": (text([1] * 9, one_text()), "INVALID_ARGUMENT"),
    "batch-over-max-items": (text([100_000], b"\0\0\0\0" * 100_000), "INVALID_ARGUMENT"),
    "huge-repeated-contents": (typed("BYTES", [1], "bytes_contents", [b""] * 200_000, "TEXT", TEXT),
                               "INVALID_ARGUMENT"),
    "huge-repeated-outputs": (Request(model_name=TEXT, inputs=[Tensor(name="TEXT", datatype="BYTES", shape=[1])],
                                      raw_input_contents=[one_text()],
                                      outputs=[Request.InferRequestedOutputTensor(name="embedding")] * 50_000),
                              "INVALID_ARGUMENT"),
    "huge-repeated-inputs": (Request(model_name=TEXT, inputs=[Tensor(name=f"in{i}", datatype="BYTES", shape=[1])
                                                              for i in range(20_000)]), "INVALID_ARGUMENT"),
    "wrong-datatype": (text([1], np.float32([1.0]).tobytes(), datatype="FP32"), "INVALID_ARGUMENT"),
    "unknown-datatype": (text([1], one_text(), datatype="STRING"), "INVALID_ARGUMENT"),
    "contents-of-another-type": (typed("UINT8", [1, 224, 224, 3], "fp32_contents", [0.0] * 150_528),
                                 "INVALID_ARGUMENT"),
    "uint8-out-of-range": (typed("UINT8", [1, 224, 224, 3], "uint_contents", [300] * 150_528), "INVALID_ARGUMENT"),
    "fp16-in-contents": (typed("FP16", [1], "fp32_contents", [1.0], "x", TEXT), "INVALID_ARGUMENT"),
    "raw-count-mismatch": (Request(model_name=TEXT, inputs=[Tensor(name="TEXT", datatype="BYTES", shape=[1])],
                                   raw_input_contents=[one_text(), one_text()]), "INVALID_ARGUMENT"),
    "unknown-input": (text([1], one_text(), name="WHAT"), "INVALID_ARGUMENT"),
    "unknown-output": (Request(model_name=TEXT, inputs=[Tensor(name="TEXT", datatype="BYTES", shape=[1])],
                               raw_input_contents=[one_text()],
                               outputs=[Request.InferRequestedOutputTensor(name="logits")]), "INVALID_ARGUMENT"),
    "not-utf8": (text([1], one_text(b"\xff\xfe")), "INVALID_ARGUMENT"),
    "empty-text": (text([1], one_text(b"  ")), "INVALID_ARGUMENT"),
    "not-an-image": (Request(model_name=IMAGE, inputs=[Tensor(name="IMAGE", datatype="BYTES", shape=[1])],
                             raw_input_contents=[one_text(b"GIF89a not really")]), "INVALID_ARGUMENT"),
    "unknown-model": (text([1], one_text(), model="no-such-model"), "NOT_FOUND"),
    "unknown-version": (text([1], one_text(), model_version="7"), "NOT_FOUND"),
    "over-the-size-limit": (text([1], one_text(b"x" * (2 * 1024 * 1024))), "RESOURCE_EXHAUSTED"),
    "no-live-worker": (Request(model_name=IMAGE, inputs=[Tensor(name="pixels", datatype="UINT8",
                                                                shape=[1, 224, 224, 3])],
                               raw_input_contents=[b"\0" * 150_528]), "UNAVAILABLE"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_message_gets_the_protocols_status(stub, stack, name):
    request, code = HOSTILE[name]
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request, timeout=30)
    elapsed = time.monotonic() - started
    error = refused.value
    assert error.code().name == code, error.details()
    assert error.details() and "Traceback" not in error.details()
    assert elapsed < BOUND_S, f"{name} took {elapsed:.2f} s"
    if code == "UNAVAILABLE":
        assert int(dict(error.trailing_metadata())["retry-after"]) >= 1
    assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=5).live
    assert stack.grpc.poll() is None


def test_the_calls_deadline_is_the_jobs(model_store, tmp_path):
    """A client's deadline becomes the job's (never past FUNNEL_REQUEST_TIMEOUT_S), as X-Request-Timeout
    does on HTTP: held without a worker, the queued job says when it is due."""
    env = {"FUNNEL_HOLD_WITHOUT_WORKERS": "1"}
    with Stack(model_store=model_store, models=[TEXT], workers=[], grpc_port=free_port(), web_env=env,
               log_dir=tmp_path) as held:
        queue = redis.Redis.from_url(held.redis_url)
        with grpc.insecure_channel(f"127.0.0.1:{held.grpc_port}") as channel:
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(
                text([1], one_text(b"due soon")), timeout=2)
            sent_ms = time.time() * 1000
            wait_for(lambda: queue.llen(Keys().queue(TEXT)) == 1, what="the job queued")
            job = decode_job(queue.lindex(Keys().queue(TEXT), 0))
            assert sent_ms + 1000 < job.deadline < sent_ms + 2500
            with pytest.raises(grpc.RpcError) as late:
                call.result(timeout=10)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
