"""Hostile /v2 infer bodies: each gets a 400 in the protocol's error shape, and nothing is queued.

No worker runs here, so a job that slipped through would stay on its queue: the
queues must be empty after every case.
"""

from __future__ import annotations

import json
import struct
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import redis

from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from tests.support import FAULT_TABLE, Outcome

IMAGE, TEXT = "image-classifier", "text-embedding"


@pytest.fixture(scope="module")
def stack(model_store):
    with Stack(model_store=model_store, workers=[], web_env={"FUNNEL_MAX_ITEMS": "8"}) as running:
        yield running


@pytest.fixture(scope="module")
def outcome():
    collected = Outcome()
    yield collected
    FAULT_TABLE.append(("hostile /v2 infer bodies (each case below)", collected, 0))


def body(header: dict, binary: bytes = b"") -> tuple[bytes, dict]:
    head = json.dumps(header).encode()
    return head + binary, ({"Inference-Header-Content-Length": str(len(head))} if binary else {})


def text_input(shape, size, **extra):
    return {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": shape,
                        "parameters": {"binary_data_size": size}, **extra}]}


ONE_TEXT = struct.pack("<I", 5) + b"hello"
CASES = {
    "header length past the body": (TEXT, *body(text_input([1], 9), ONE_TEXT)[:1],
                                     {"Inference-Header-Content-Length": "99999"}),
    "header length not a number": (TEXT, json.dumps(text_input([1], 9)).encode() + ONE_TEXT,
                                   {"Inference-Header-Content-Length": "12abc"}),
    "binary_data_size past the end": (TEXT, *body(text_input([1], 500), ONE_TEXT)),
    "a BYTES length past the end": (TEXT, *body(text_input([1], 9), struct.pack("<I", 400) + b"hello")),
    "a cut-off BYTES length": (TEXT, *body(text_input([2], 11), ONE_TEXT + b"\x01\x00")),
    "BYTES count unlike the shape": (TEXT, *body(text_input([3], 9), ONE_TEXT)),
    "bytes after the last input": (TEXT, *body(text_input([1], 9), ONE_TEXT + b"extra")),
    "JSON data unlike the shape": (TEXT, json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES",
                                                                "shape": [2], "data": ["a"]}]}).encode(), {}),
    "a huge declared shape": (IMAGE, *body({"inputs": [{"name": "pixels", "datatype": "UINT8",
                                                        "shape": [100000, 224, 224, 3],
                                                        "parameters": {"binary_data_size": 16}}]}, b"\0" * 16)),
    "pixels of the wrong shape": (IMAGE, *body({"inputs": [{"name": "pixels", "datatype": "UINT8",
                                                            "shape": [1, 8, 8, 3],
                                                            "parameters": {"binary_data_size": 192}}]},
                                              b"\0" * 192)),
    "pixels of the wrong datatype": (IMAGE, json.dumps({"inputs": [{
        "name": "pixels", "datatype": "FP32", "shape": [1, 224, 224, 3],
        "data": np.zeros(224 * 224 * 3).tolist()}]}).encode(), {}),
    "an unknown datatype": (TEXT, json.dumps({"inputs": [{"name": "TEXT", "datatype": "STRING",
                                                         "shape": [1], "data": ["a"]}]}).encode(), {}),
    "a negative dimension": (TEXT, json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES",
                                                          "shape": [-1], "data": ["a"]}]}).encode(), {}),
    "a batch over FUNNEL_MAX_ITEMS": (TEXT, json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES",
                                                                   "shape": [9], "data": ["a"] * 9}]}).encode(),
                                      {}),
    "an unknown input": (TEXT, json.dumps({"inputs": [{"name": "WORDS", "datatype": "BYTES", "shape": [1],
                                                      "data": ["a"]}]}).encode(), {}),
    "an unknown output": (TEXT, json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1],
                                                       "data": ["a"]}],
                                            "outputs": [{"name": "logits"}]}).encode(), {}),
    "not JSON": (TEXT, b"{inputs: nope", {}),
    "no inputs": (TEXT, b'{"inputs": []}', {}),
    "text not UTF-8": (TEXT, *body(text_input([1], 6), struct.pack("<I", 2) + b"\xff\xfe")),
    "not an image": (IMAGE, *body({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1],
                                               "parameters": {"binary_data_size": 9}}]}, ONE_TEXT)),
}


def post(url: str, data: bytes, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/octet-stream", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_body_is_refused_and_queues_nothing(stack, outcome, case):
    model, data, headers = CASES[case]
    started = time.monotonic()
    status, answer = post(f"{stack.url}/v2/models/{model}/infer", data, headers)
    outcome.add(status, time.monotonic() - started)
    assert status == 400, (case, answer)
    assert isinstance(answer.get("error"), str) and answer["error"], answer
    client = redis.Redis.from_url(stack.redis_url)
    keys = Keys()
    assert client.llen(keys.queue(IMAGE)) == 0 and client.llen(keys.queue(TEXT)) == 0
