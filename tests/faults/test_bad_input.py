"""Every kind of bad input gets a clear JSON error with the right status, and loses nothing else."""

import json

import numpy as np
import pytest
import redis

from funnel.common.contracts import wire
from funnel.scripts.stack import Stack
from tests.support import FAULT_TABLE, Outcome, http, jpeg_bytes, multipart, wait_for

IMAGE, TEXT = "image-classifier", "text-embedding"


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, log_dir=tmp_path_factory.mktemp("bad-input"),
               web_env={"FUNNEL_MAX_BODY_MB": "1", "FUNNEL_LIMITS": "max_pixels=1000000,max_chars=2000",
                        "FUNNEL_MAX_ITEMS": "8"}) as running:
        yield running


@pytest.fixture(scope="module")
def outcome():
    """All cases together make one row of the fault table."""
    collected = Outcome()
    yield collected
    FAULT_TABLE.append(("bad inputs through HTTP (each case below)", collected, 0))


def jpeg(cat_jpeg):
    return {"body": cat_jpeg, "headers": {"Content-Type": "image/jpeg"}}


BOMB = jpeg_bytes(np.zeros((1100, 1000, 3), np.uint8))  # 1.1 Mpx over a 1 Mpx limit
CASES = {
    "not an image": (IMAGE, {"body": b"GIF89a not really", "headers": {"Content-Type": "image/gif"}},
                     400, "not_an_image"),
    "truncated image": (IMAGE, "truncated", 400, "corrupt_image"),
    "decompression bomb": (IMAGE, {"body": BOMB, "headers": {"Content-Type": "image/jpeg"}},
                           400, "image_too_large"),
    "body over the size limit": (IMAGE, {"body": b"\xff" * (2 * 1024 * 1024),
                                         "headers": {"Content-Type": "image/jpeg"}},
                                 413, "request_entity_too_large"),
    "image: wrong content type": (IMAGE, {"json_body": {"text": "hi"}}, 415, "unsupported_media_type"),
    "multipart without a file field": (IMAGE, "multipart-wrong-field", 400, "missing_file"),
    "empty image": (IMAGE, {"body": b"", "headers": {"Content-Type": "image/png"}}, 400, "empty_input"),
    "text: wrong content type": (TEXT, {"body": b"hello", "headers": {"Content-Type": "text/plain"}},
                                 415, "unsupported_media_type"),
    "bad JSON": (TEXT, {"body": b'{"text": ', "headers": {"Content-Type": "application/json"}},
                 400, "bad_json"),
    "JSON not an object": (TEXT, {"json_body": ["a"]}, 400, "bad_json"),
    "empty text": (TEXT, {"json_body": {"text": "  "}}, 400, "empty_input"),
    "text too long (characters)": (TEXT, {"json_body": {"text": "x" * 2001}}, 400, "text_too_long"),
    "text too long (tokens)": (TEXT, {"json_body": {"text": "word " * 300}}, 400, "text_too_long"),
    "too many texts": (TEXT, {"json_body": {"texts": ["a"] * 9}}, 400, "too_many_items"),
    "a text that is not a string": (TEXT, {"json_body": {"texts": ["a", 7]}}, 400, "bad_json"),
    "unknown model": ("no-such-model", {"json_body": {"text": "x"}}, 404, "unknown_model"),
    "model name with key syntax": ("text-embedding:evil", {"json_body": {"text": "x"}}, 404,
                                   "unknown_model"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_refused_clearly(stack, case, cat_jpeg, outcome):
    model, request, status, code = CASES[case]
    if request == "truncated":
        request = {"body": cat_jpeg[: len(cat_jpeg) // 3], "headers": {"Content-Type": "image/jpeg"}}
    elif request == "multipart-wrong-field":
        body, headers = multipart("upload", "cat.jpg", cat_jpeg)
        request = {"body": body, "headers": headers}
    client = redis.Redis.from_url(stack.redis_url)
    got, body, headers = http("POST", f"{stack.url}/v1/models/{model}/predict", **request)
    outcome.add(got, 0)
    assert headers["Content-Type"].startswith("application/json")
    assert (got, body["error"]["code"]) == (status, code), body
    assert body["error"]["message"]
    assert client.llen(f"funnel:queue:{{{IMAGE}}}:1") == client.llen(f"funnel:queue:{{{TEXT}}}:1") == 0  # never queued
    # ...and the service goes on answering good requests.
    ok, result, _ = http("POST", f"{stack.url}/v1/models/{IMAGE}/predict", **jpeg(cat_jpeg))
    assert ok == 200 and result["predictions"]


@pytest.mark.parametrize("garbage", [
    b"\x00\x01 not msgpack at all",
    wire.encode_job(wire.Job(id="v2job", model=TEXT, items=[{"input_ids": np.array([101, 102], np.int32)}],
                             reply_to=f"funnel:reply:{{{TEXT}}}:v2job", deadline=wire.now_ms() + 60_000)
                    ).replace(b"\xa1v\x01", b"\xa1v\x02"),  # protocol version 2
    json.dumps({"v": 1, "id": "x"}).encode(),
])
def test_garbage_pushed_by_hand_is_dead_lettered_and_the_worker_goes_on(stack, garbage):
    client = redis.Redis.from_url(stack.redis_url)
    client.delete(f"funnel:dead:{{{TEXT}}}")
    client.lpush(f"funnel:queue:{{{TEXT}}}:1", garbage)  # as `redis-cli LPUSH` would
    wait_for(lambda: client.llen(f"funnel:dead:{{{TEXT}}}") == 1, what="dead-lettered")
    assert client.lrange(f"funnel:dead:{{{TEXT}}}", 0, -1) == [garbage]
    status, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": "still here"})
    assert status == 200 and len(body["embedding"]) == 384
