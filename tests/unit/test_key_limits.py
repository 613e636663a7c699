"""FUNNEL_KEY_LIMITS read (web/queueing/limits.py), and the push script's bucket against a real Redis."""

from __future__ import annotations

import json

import pytest

from funnel.common.link import lua_scripts
from funnel.web.queueing import limits, push_script


def test_limits_come_from_json_or_a_file(tmp_path):
    text = json.dumps({"alice": {"rate": 20, "burst": 40, "concurrency": 8}, "*": {"rate": 5}})
    parsed = limits.parse(text)
    assert parsed["alice"] == limits.Limit(rate=20.0, burst=40.0, concurrency=8)
    (tmp_path / "limits.json").write_text(text)
    assert limits.parse(f"@{tmp_path / 'limits.json'}") == parsed
    assert limits.of(parsed, "alice").concurrency == 8
    assert limits.of(parsed, "bob") == limits.Limit(rate=5.0, burst=0.0, concurrency=0)  # "*": every other key
    assert limits.of({}, "alice") is None and limits.parse("") == {}
    assert limits.Limit(rate=5.0).script_args() == [5.0, 5.0, 0]  # burst: a second's worth


@pytest.mark.parametrize("text, says", [
    ("{", "not JSON"), ("[1]", "JSON object"), ('{"a": {"rate": -1}}', ">= 0"), ('{"a": {"speed": 1}}', "takes"),
    ('{"a": {"concurrency": 1.5}}', "whole number"), ('{"a": {"rate": true}}', ">= 0"),
    ("@/nowhere.json", "cannot read"),
])
def test_bad_limits_say_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        limits.parse(text)


def test_the_bucket_refills_at_the_rate(redis_client, keys):
    push = lua_scripts.register(redis_client, "push")
    limit = limits.Limit(rate=2, burst=2)

    def send(now_ms: int) -> list:
        call = push_script.PushCall(model="m", version=1, lane="normal", jobs=[b"job"], budget_s=10, owner="owner1",
                                    limit=limit, now_ms=now_ms, token=f"t{now_ms}", deadline_ms=now_ms + 10_000)
        return push(keys=call.keys(keys), args=call.args())

    t = 1_000_000
    assert send(t)[0] == 1 and send(t)[0] == 1
    refused = send(t)
    assert refused[0] == -2 and refused[1] == 500  # half a second to the next token at 2 a second
    assert send(t + 499)[0] == -2 and send(t + 500)[0] == 1
    assert redis_client.llen(keys.queue("m")) == 3  # a refused request queues nothing
