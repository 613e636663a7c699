"""Digits that Python's str.isdigit() takes and int() refuses ('²', a byte 0xb2 in a latin-1 header):
a version, a priority or a traffic weight's version of them is refused as any other bad value, with
a 4xx, never a 500."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from funnel.scripts.stack import Stack
from tests.support import TEXT, http

TEXTS = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}).encode()
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, models=[TEXT], workers=[],
               log_dir=tmp_path_factory.mktemp("digits")) as running:
        yield running


@pytest.mark.parametrize("version", ["²", "٣", "1.0"])
def test_a_version_that_is_no_decimal_number_is_a_404(stack, version):
    quoted = urllib.parse.quote(version)
    for method, path, data in (("POST", f"/v2/models/{TEXT}/versions/{quoted}/infer", TEXTS),
                               ("GET", f"/v2/models/{TEXT}/versions/{quoted}", None),
                               ("POST", f"/v1/models/{TEXT}/versions/{quoted}/predict", b'{"text": "x"}')):
        status, _, _ = http(method, f"{stack.url}{path}", data, JSON)
        assert status == 404, (method, path, status)


def test_a_priority_of_such_digits_is_a_400(stack):
    status, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", b'{"text": "x"}',
                           {**JSON, "X-Priority": "²"})  # sent as the byte 0xb2
    assert status == 400 and body["error"]["code"] == "bad_priority"


def test_a_traffic_version_of_such_digits_is_a_400(stack):
    status, body, _ = http("PUT", f"{stack.url}/v1/models/{TEXT}/traffic", json_body={"weights": {"²": 1}})
    assert status == 400 and body["error"]["code"] == "bad_traffic"
