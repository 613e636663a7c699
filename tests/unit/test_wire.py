import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from funnel.common.contracts import wire
from funnel.common.contracts.wire import Job, Reply, WireError


def make_job(**inputs) -> Job:
    return Job(id="abc123", model="text-embedding", items=[inputs or {"x": np.arange(3, dtype=np.int32)}],
               reply_to="funnel:reply:{m}:abc123", deadline=wire.now_ms() + 1000)


@pytest.mark.parametrize("dtype", sorted(wire.DTYPES))
def test_job_round_trip_keeps_every_dtype(dtype):
    array = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    job = make_job(t=array, scalar=np.array(5, dtype=dtype))
    back = wire.decode_job(wire.encode_job(job))
    assert back.items[0]["t"].dtype == np.dtype(dtype)
    assert back.items[0]["t"].shape == (2, 3, 4)
    np.testing.assert_array_equal(back.items[0]["t"], array)
    assert back.items[0]["scalar"].shape == ()
    assert (back.id, back.model, back.reply_to, back.deadline, back.attempt) == (
        job.id, job.model, job.reply_to, job.deadline, 0)


def test_decoded_tensor_is_a_view_of_the_message_bytes():
    back = wire.decode_job(wire.encode_job(make_job(t=np.ones((64, 64), np.float32))))
    assert not back.items[0]["t"].flags.owndata  # frombuffer, no copy


@pytest.mark.parametrize("dtype", sorted(wire.DTYPES))
def test_reply_round_trip_with_tensors_and_plain_values(dtype):
    out = np.linspace(0, 5, 6).astype(dtype)
    reply = Reply(id="j1", ok=True, outputs={"t": out, "labels": [{"label": "cat", "p": 0.5}]},
                  worker="w1", batch_size=4, queue_ms=1.5, infer_ms=2.5)
    back = wire.decode_reply(wire.encode_reply(reply))
    np.testing.assert_array_equal(back.outputs["t"], out)
    assert back.outputs["labels"] == [{"label": "cat", "p": 0.5}]
    assert (back.worker, back.batch_size, back.queue_ms, back.infer_ms) == ("w1", 4, 1.5, 2.5)


def test_error_reply_round_trip():
    back = wire.decode_reply(wire.encode_reply(Reply.failure("j1", "bad_input", "nope")))
    assert not back.ok and back.error == {"code": "bad_input", "message": "nope"}


def test_byte_order_is_normalised():
    big = np.arange(4, dtype=">i4")
    back = wire.decode_job(wire.encode_job(make_job(t=big)))
    np.testing.assert_array_equal(back.items[0]["t"], big)


def valid_job_map() -> dict:
    return msgpack.unpackb(wire.encode_job(make_job()), raw=False)


@pytest.mark.parametrize("mutate, message", [
    (lambda m: m.update(v=2), "version"),
    (lambda m: m.pop("v"), "version"),
    (lambda m: m.pop("id"), "missing field 'id'"),
    (lambda m: m.update(deadline="soon"), "wrong type"),
    (lambda m: m.update(attempt=True), "wrong type"),
    (lambda m: m.update(inputs={}), "non-empty"),
    (lambda m: m.update(inputs=[1, 2]), "wrong type"),
    (lambda m: m["inputs"]["x"].update(dtype="object"), "unknown dtype"),
    (lambda m: m["inputs"]["x"].update(shape=[4]), "needs 16 bytes"),
    (lambda m: m["inputs"]["x"].update(shape=[-1, 3]), "bad tensor shape"),
    (lambda m: m["inputs"]["x"].update(data="text"), "must be bytes"),
    (lambda m: m["inputs"]["x"].update(extra=1), "exactly dtype"),
])
def test_malformed_jobs_are_rejected(mutate, message):
    obj = valid_job_map()
    mutate(obj)
    with pytest.raises(WireError, match=message):
        wire.decode_job(msgpack.packb(obj, use_bin_type=True))


@pytest.mark.parametrize("data", [b"", b"\xc1", b"garbage bytes", msgpack.packb([1, 2, 3]),
                                  msgpack.packb({"v": 1}), "not bytes", None])
def test_garbage_is_a_wire_error(data):
    with pytest.raises(WireError):
        wire.decode_job(data)


def test_oversized_message_is_rejected(monkeypatch):
    monkeypatch.setattr(wire, "MAX_MESSAGE_BYTES", 1024)
    with pytest.raises(WireError, match="exceeds"):
        wire.decode_job(wire.encode_job(make_job(t=np.zeros(4096, np.uint8))))


def test_object_arrays_cannot_be_sent():
    with pytest.raises(WireError):
        wire.encode_job(make_job(t=np.array(["a", "b"], dtype=object)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_any_bytes_decode_to_a_job_or_a_wire_error(data):
    try:
        wire.decode_job(data)
    except WireError:
        pass
    try:
        wire.decode_reply(data)
    except WireError:
        pass


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(dtype=st.sampled_from(sorted(wire.DTYPES)),
                  shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=5)))
def test_any_array_round_trips_exactly(array):
    back = wire.decode_job(wire.encode_job(make_job(t=array))).items[0]["t"]
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


VALID_JOB = wire.encode_job(make_job(t=np.arange(6, dtype=np.float32).reshape(2, 3)))
SEVERAL = wire.encode_job(Job(id="j", model="m", items=[{"t": np.arange(3, dtype=np.int32)}] * 3, reply_to="r",
                              deadline=1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SEVERAL) - 1), st.integers(0, 255)), max_size=4))
def test_corrupted_jobs_of_several_items_decode_or_fail_cleanly(flips):
    data = bytearray(SEVERAL)
    for index, value in flips:
        data[index] = value
    try:
        job = wire.decode_job(bytes(data))
    except WireError:
        return
    assert len(job.items) == wire.item_count(bytes(data)) == 3  # a count that lies is refused


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(VALID_JOB) - 1), st.integers(0, 255)), max_size=4),
       st.integers(0, len(VALID_JOB)))
def test_corrupted_valid_jobs_decode_or_fail_cleanly(flips, cut):
    """Near-valid messages (bytes flipped, tail cut) reach deeper checks than random bytes."""
    data = bytearray(VALID_JOB[:cut] if cut else VALID_JOB)
    for index, value in flips:
        if index < len(data):
            data[index] = value
    try:
        job = wire.decode_job(bytes(data))
    except WireError:
        return
    assert isinstance(job, Job) and all(isinstance(t, np.ndarray) for item in job.items for t in item.values())
    assert 0 < len(job.items) == wire.item_count(bytes(data)) or len(job.items) == 1


def test_a_jobs_model_version_round_trips():
    job = make_job()
    assert job.version == 1 and wire.decode_job(wire.encode_job(job)).version == 1
    job.version = 7
    assert wire.decode_job(wire.encode_job(job)).version == 7


def test_a_replys_model_version_round_trips():
    assert wire.decode_reply(wire.encode_reply(Reply(id="j", ok=True, outputs={}))).version == 1
    back = wire.decode_reply(wire.encode_reply(Reply(id="j", ok=True, outputs={"x": 1}, version=3)))
    assert back.version == 3 and back.outputs == {"x": 1}
    failed = wire.decode_reply(wire.encode_reply(Reply.failure("j", "bad_input", "no", version=2)))
    assert failed.version == 2 and not failed.ok


def test_messages_from_before_versions_are_version_1():
    """A job or reply written without the field (an older web or worker) decodes as version 1,
    under the same protocol version."""
    old_job = valid_job_map()
    old_job.pop("version")
    old_job.pop("raw")
    assert old_job["v"] == wire.VERSION == 1
    back = wire.decode_job(msgpack.packb(old_job, use_bin_type=True))
    assert back.version == 1 and back.raw is False
    old_reply = msgpack.unpackb(wire.encode_reply(Reply(id="j", ok=True, outputs={}, version=5)), raw=False)
    old_reply.pop("version")
    assert wire.decode_reply(msgpack.packb(old_reply, use_bin_type=True)).version == 1


@pytest.mark.parametrize("version", [0, -2, True, 1.5, "2", None, [2]])
def test_a_bad_model_version_is_a_wire_error(version):
    job = valid_job_map()
    job["version"] = version
    with pytest.raises(WireError, match="version|wrong type"):
        wire.decode_job(msgpack.packb(job, use_bin_type=True))
    reply = msgpack.unpackb(wire.encode_reply(Reply(id="j", ok=True, outputs={})), raw=False)
    reply["version"] = version
    with pytest.raises(WireError, match="version|wrong type"):
        wire.decode_reply(msgpack.packb(reply, use_bin_type=True))


def test_a_jobs_trace_and_request_id_round_trip_and_cost_nothing_unset():
    job = make_job()
    plain = wire.encode_job(job)
    assert b"trace" not in plain and b"request_id" not in plain  # an untraced job is as before
    back = wire.decode_job(plain)
    assert back.trace == "" and back.request_id == ""
    job.trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    job.request_id = "req-42"
    back = wire.decode_job(wire.encode_job(job))
    assert back.trace == job.trace and back.request_id == "req-42"


@pytest.mark.parametrize("name", ["trace", "request_id"])
def test_a_mistyped_trace_or_request_id_is_a_wire_error(name):
    job = valid_job_map()
    job[name] = 42
    with pytest.raises(WireError, match="wrong type"):
        wire.decode_job(msgpack.packb(job, use_bin_type=True))


@pytest.mark.parametrize("count", [1, 2, 64, 127, 128, 255, 256, 1000, wire.MAX_JOB_ITEMS])
def test_a_job_of_several_items_round_trips_with_its_count_where_the_take_reads_it(count):
    items = [{"t": np.full(2, i, np.int32)} for i in range(count)]
    data = wire.encode_job(Job(id="j", model="m", items=items, reply_to="r", deadline=1))
    assert wire.item_count(data) == count
    back = wire.decode_job(data)
    assert [int(item["t"][0]) for item in back.items] == list(range(count))
    if count == 1:  # as jobs always were: any worker reads it
        assert "inputs" in msgpack.unpackb(data, raw=False) and "n" not in msgpack.unpackb(data, raw=False)


@pytest.mark.parametrize("count", [0, wire.MAX_JOB_ITEMS + 1])
def test_a_job_holds_one_to_max_items(count):
    with pytest.raises(WireError, match="holds 1 to"):
        wire.encode_job(Job(id="j", model="m", items=[{"t": np.zeros(1, np.int32)}] * count, reply_to="r",
                            deadline=1))


@pytest.mark.parametrize("mutate, message", [
    (lambda m: m.update(n=2), "says it has 2"),
    (lambda m: m.update(n=1, items=m["items"][:1]), "says it has 1"),
    (lambda m: m.update(inputs=m["items"][0]), "either inputs or items"),
    (lambda m: m.pop("n"), "missing field 'n'"),
    (lambda m: m["items"].__setitem__(1, [1]), "non-empty map"),
])
def test_a_job_of_several_items_whose_count_or_items_lie_is_refused(mutate, message):
    obj = msgpack.unpackb(SEVERAL, raw=False)
    mutate(obj)
    with pytest.raises(WireError, match=message):
        wire.decode_job(msgpack.packb(obj, use_bin_type=True))


def test_a_reply_of_several_items_round_trips_and_splits_into_one_per_item():
    reply = Reply(id="j", ok=True, items=[{"t": np.arange(2, dtype=np.float32)}, {"label": "cat"}], worker="w",
                  batch_size=7, version=2)
    back = wire.decode_reply(wire.encode_reply(reply))
    each = back.each()
    assert [r.id for r in each] == ["j", "j"] and all(r.batch_size == 7 and r.version == 2 for r in each)
    np.testing.assert_array_equal(each[0].outputs["t"], [0, 1])
    assert each[1].outputs == {"label": "cat"}
    failed = wire.decode_reply(wire.encode_reply(Reply.failure("j", "bad_input", "no", item=3)))
    assert failed.item == 3 and failed.each() == [failed]
    assert wire.decode_reply(wire.encode_reply(Reply.failure("j", "bad_input", "no"))).item == -1


# -- item contexts ---------------------------------------------------------

CONTEXT = {"size": [640, 480], "scale": 0.1, "pad": [0, 8], "name": "cat.jpg", "ok": True, "none": None,
           "nested": {"words": [[0, 3], [4, 9]]}}


def test_item_contexts_round_trip_beside_their_items_and_recovery_keeps_them():
    job = Job(id="j", model="m", items=[{"x": np.arange(3, dtype=np.int32)}] * 3, reply_to="r", deadline=1,
              contexts=[CONTEXT, None, {"n": 1}])
    back = wire.decode_job(wire.encode_job(job))
    assert back.contexts == [CONTEXT, None, {"n": 1}]
    assert wire.decode_job(wire.encode_job(back)).contexts == back.contexts  # requeued as read
    assert wire.item_count(wire.encode_job(job)) == 3 and wire.peek_job(wire.encode_job(job))["id"] == "j"


def test_a_job_without_contexts_is_the_bytes_it_always_was():
    data = wire.encode_job(make_job())
    assert b"contexts" not in data and wire.decode_job(data).contexts is None


@pytest.mark.parametrize("bad, says", [
    ([1, 2], "a context is a map"),
    ({"x": np.float32(1.0)}, "not float32"),
    ({"x": np.arange(3)}, "not ndarray"),
    ({"x": b"raw"}, "not bytes"),
    ({"x": {1: "a"}}, "keys are strings"),
    ({"x": 2 ** 70}, "cannot go on the wire"),
    ({"x": "a" * (wire.MAX_CONTEXT_BYTES + 1)}, "exceeds"),
    ({"x": [[[[[[[[[1]]]]]]]]]}, "deeper"),
])
def test_a_context_the_wire_cannot_carry_is_refused(bad, says):
    with pytest.raises(WireError, match=says):
        wire.check_context(bad)


@pytest.mark.parametrize("contexts, says", [
    ([{"a": 1}, {"b": 2}], "1 items has 2 contexts"),
    ([[1]], "a context is a map"),
    ("nope", "wrong type"),
])
def test_a_job_whose_contexts_are_wrong_is_a_wire_error(contexts, says):
    obj = msgpack.unpackb(wire.encode_job(make_job()), raw=False)
    obj["contexts"] = contexts
    with pytest.raises(WireError, match=says):
        wire.decode_job(msgpack.packb(obj, use_bin_type=True))
