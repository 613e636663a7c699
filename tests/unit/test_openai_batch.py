"""An OpenAI batch's input lines read, its description kept, and its output and error lines written:
protocols/openai_batch.py and common/bulk/batch_store.py without Redis or a web server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from funnel.common.bulk import jobs
from funnel.common.bulk.batch_store import (
    ERRORS,
    OUTPUT,
    Description,
    Rejected,
    RequestLine,
    job_of_batch,
    parse_file_id,
    result_file_id,
)
from funnel.common.contracts.wire import Reply, encode_reply
from funnel.common.errors import NotFound
from funnel.web.protocols import openai_batch
from funnel.web.protocols.openai import BadParam, OpenAIEmbeddings
from funnel.web.protocols.openai_batch import NotARequest, request_of

JOB = "0" * 12 + "ab" * 10


def raw(**fields) -> bytes:
    return json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "m", "input": "x"}, **fields}).encode()


@pytest.mark.parametrize("line, code", [
    (b"{not json", "invalid_json_line"), (b"[1, 2]", "invalid_json_line"),
    (raw(custom_id=""), "invalid_custom_id"), (raw(custom_id=7), "invalid_custom_id"),
    (raw(custom_id="x" * 513), "invalid_custom_id"), (raw(method="GET"), "invalid_method"),
    (raw(url="/v1/chat/completions"), "mismatched_url"), (raw(body="x"), "invalid_body"),
])
def test_a_line_that_is_no_request_names_why(line, code):
    with pytest.raises(NotARequest) as caught:
        request_of(line, "/v1/embeddings", set())
    assert caught.value.code == code


def test_a_custom_id_is_used_once():
    seen: set[str] = set()
    assert request_of(raw(), "/v1/embeddings", seen) == ("a", {"model": "m", "input": "x"})
    with pytest.raises(NotARequest, match="earlier line") as caught:
        request_of(raw(), "/v1/embeddings", seen)
    assert caught.value.custom_id == "a"


def description(lines: list[RequestLine], rejected: list[Rejected] = ()) -> Description:
    return Description(input_file_id="file-x", endpoint="/v1/embeddings", completion_window="24h", model="m",
                       good=len(lines), refused=len(rejected), metadata={"k": "v"}, lines=lines,
                       rejected=list(rejected))


def test_a_description_round_trips_through_msgpack_its_head_apart():
    made = description([RequestLine(number=1, custom_id="a", start=0, count=2, tokens=9, base64=True)],
                       [Rejected(number=2, custom_id=None, code="invalid_json_line", message="no", param=None,
                                 status=0)])
    made.cancelled_ms, made.counts = 5, [1, 1]
    assert Description.decode(made.encode(), made.encode_lines()) == made and made.total == 2
    head = Description.decode(made.encode())
    assert head.lines == head.rejected == [] and head.total == 2 and head.cancelled_ms == 5


def test_ids_name_their_job_or_nothing():
    assert job_of_batch(f"batch_{JOB}") == JOB
    assert parse_file_id(result_file_id(JOB, OUTPUT)) == (JOB, OUTPUT)
    assert parse_file_id(f"file-{JOB}") == (JOB, "")
    for bad in ("batch_x", f"batch_{JOB}0", f"file-{JOB}-other", "file-", JOB):
        with pytest.raises(NotFound):
            (job_of_batch if bad.startswith("batch") else parse_file_id)(bad)


def payload(index: int, ok: bool = True) -> bytes:
    if ok:
        return encode_reply(Reply(id=f"{JOB}-{index}", ok=True,
                                  outputs={"embedding": np.full(3, index, np.float32)}))
    return encode_reply(Reply(id=f"{JOB}-{index}", ok=False, error={"code": "inference_failed", "message": "boom"}))


def record(total: int, done: int, failed: int = 0, cancelled: bool = False) -> jobs.Record:
    return jobs.Record(id=JOB, model="m", total=total, done=done, failed=failed, duplicates=0, created_ms=1000,
                       finished_ms=2000 if done == total else 0, ttl_ms=86_400_000, cancelled=cancelled,
                       body_sha256="")


def test_output_and_error_lines_by_custom_id_in_line_order():
    lines = [RequestLine(number=1, custom_id="one", start=0, count=1, tokens=3, base64=False),
             RequestLine(number=3, custom_id="two", start=1, count=2, tokens=6, base64=True),
             RequestLine(number=4, custom_id="bad", start=3, count=1, tokens=2, base64=False)]
    made = description(lines, [Rejected(number=2, custom_id="refused", code="invalid_value", message="empty",
                                        param="input", status=400)])
    pages = [[payload(0), payload(1)], [payload(2), payload(3, ok=False)]]
    done = record(4, 4, failed=1)
    output = [json.loads(x) for x in openai_batch.result_lines(done, made, OUTPUT, pages)]
    assert [o["custom_id"] for o in output] == ["one", "two"]
    assert output[0]["response"]["body"]["data"][0]["embedding"] == [0.0, 0.0, 0.0]
    assert isinstance(output[1]["response"]["body"]["data"][1]["embedding"], str)  # base64
    assert output[1]["response"]["body"]["usage"]["prompt_tokens"] == 6
    errors = [json.loads(x) for x in openai_batch.result_lines(done, made, ERRORS, pages)]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("refused", 400), ("bad", 500)]
    assert openai_batch.counts(done, made, lambda: pages) == (2, 2)


def test_a_cancel_leaves_unanswered_lines_in_the_error_file():
    made = description([RequestLine(number=1, custom_id="a", start=0, count=1, tokens=1, base64=False),
                        RequestLine(number=2, custom_id="b", start=1, count=1, tokens=1, base64=False)])
    pages = [[payload(0), None]]
    stopped = record(2, 1, cancelled=True)
    errors = [json.loads(x) for x in openai_batch.result_lines(stopped, made, ERRORS, pages)]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("b", "batch_cancelled")]
    assert openai_batch.counts(stopped, made, lambda: pages) == (1, 1)
    running = record(2, 1)
    assert list(openai_batch.result_lines(running, made, ERRORS, pages)) == []  # not final: nothing told yet


def test_the_batch_object_follows_its_job():
    made = description([RequestLine(number=1, custom_id="a", start=0, count=1, tokens=1, base64=False)])
    running = openai_batch.batch_object(record(1, 0), made, (0, 0), 86_400)
    assert running["status"] == "in_progress" and running["output_file_id"] is None
    done = openai_batch.batch_object(record(1, 1), made, (1, 0), 86_400)
    assert done["status"] == "completed" and done["output_file_id"] == result_file_id(JOB, OUTPUT)
    assert done["error_file_id"] is None and done["completed_at"] == 2 and done["expires_at"] == 1 + 86_400
    cancelling = openai_batch.batch_object(record(1, 0, cancelled=True), made, (0, 1), 86_400, settled=False)
    assert cancelling["status"] == "cancelling" and cancelling["output_file_id"] is None


class FakeTask:
    """A text model giving 3-d embeddings: what read_file asks of a task."""

    input_kind = "text"
    spec = type("Spec", (), {"name": "m", "version": 1})()

    @staticmethod
    def output_shapes() -> dict:
        return {"embedding": (3,)}


def read(lines: list[bytes], max_items: int = 100) -> openai_batch.Read:
    def resolve(name: str):
        if name != "m":
            raise NotFound(f"no model named {name!r}", code="unknown_model")
        return FakeTask()

    def prepare(task, texts):  # as the pipeline's: each item's arrays and context
        return [({"input_ids": np.arange(len(t.split()) + 2, dtype=np.int32)}, None) for t in texts]

    return openai_batch.read_file(b"\n".join(lines), "/v1/embeddings", OpenAIEmbeddings(max_items=8), resolve,
                                  prepare, max_items)


def test_good_lines_become_items_and_the_rest_are_told_why():
    made = read([raw(custom_id="one"), b"", raw(custom_id="two", body={"model": "m", "input": ["a b", "c"]}),
                 raw(custom_id="other", body={"model": "n", "input": "x"}),
                 raw(custom_id="empty", body={"model": "m", "input": []})])
    assert [(line.custom_id, line.start, line.count, line.tokens) for line in made.lines] == \
        [("one", 0, 1, 3), ("two", 1, 2, 7)]
    assert len(made.items) == 3 and made.task is not None
    assert [(r.number, r.custom_id, r.code, r.status) for r in made.rejected] == \
        [(4, "other", "mismatched_model", 400), (5, "empty", "invalid_value", 400)]


def test_a_file_of_too_many_texts_is_refused_before_it_is_all_read():
    with pytest.raises(BadParam, match="line 2") as caught:
        read([raw(custom_id=f"l{i}", body={"model": "m", "input": ["a", "b", "c"]}) for i in range(1000)],
             max_items=5)
    assert caught.value.code == "too_many_items"
