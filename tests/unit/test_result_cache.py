"""common/result_cache.py: the policy model.json states, the digest of what the model is fed, an
entry read back, and the job's cache ident on the wire."""

from __future__ import annotations

import numpy as np
import pytest

from funnel.common.contracts import wire
from funnel.common.result_cache import SHARED, CachePolicy, digest, entry_reply


def test_a_policy_is_off_unless_stated_and_a_bad_one_fails_its_load():
    assert not CachePolicy.of({}).on
    policy = CachePolicy.of({"cache": {"ttl_s": 60}})
    assert policy.on and policy.scope("ab" * 32) == "ab" * 16 and policy.scope("") == SHARED
    assert CachePolicy.of({"cache": {"ttl_s": 60, "shared": True}}).scope("ab" * 32) == SHARED
    for bad in ({"ttl_s": -1}, {"ttl_s": "60"}, {"ttl_s": 60, "shared": 1}, {"ttl": 60}, 60):
        with pytest.raises(ValueError):
            CachePolicy.of({"cache": bad})


def test_the_digest_is_of_names_dtypes_shapes_bytes_and_the_kind_of_answer():
    ids = np.arange(6, dtype=np.int32)
    base = digest({"input_ids": ids}, raw=False)
    assert digest({"input_ids": ids.copy()}, raw=False) == base
    assert digest({"input_ids": ids[::-1].copy()[::-1]}, raw=False) == base  # contiguity is not content
    for other in ({"input_ids": ids.astype(np.int64)}, {"input_ids": ids.reshape(2, 3)}, {"ids": ids},
                  {"input_ids": ids + 1}):
        assert digest(other, raw=False) != base
    assert digest({"input_ids": ids}, raw=True) != base


def test_an_entry_is_a_one_item_success_or_a_miss():
    good = wire.encode_reply(wire.Reply(id="j", ok=True, outputs={"embedding": np.ones(3, np.float32)}))
    assert np.array_equal(entry_reply(good).outputs["embedding"], np.ones(3))
    for bad in (b"", b"garbage", wire.encode_reply(wire.Reply.failure("j", "x", "y")),
                wire.encode_reply(wire.Reply(id="j", ok=True, items=[{}, {}])), good[:-3]):
        assert entry_reply(bad) is None


def test_a_job_s_cache_ident_travels_and_a_hostile_one_is_refused():
    job = wire.Job(id="j", model="m", items=[{"x": np.zeros(1)}], reply_to="r", deadline=1,
                   cache="shared:" + "0" * 32)
    assert wire.decode_job(wire.encode_job(job)).cache == job.cache
    assert wire.decode_job(wire.encode_job(wire.Job(**{**job.__dict__, "cache": ""}))).cache == ""
    for hostile in ("shared:" + "0" * 31, "a b:" + "0" * 32, "x" * 65 + ":" + "0" * 32, "*:" + "0" * 32):
        with pytest.raises(wire.WireError):
            wire.decode_job(wire.encode_job(wire.Job(**{**job.__dict__, "cache": hostile})))
