"""/v1/files and /v1/batches driven by OpenAI's own Python client against a live stack.

Every output line is compared with /v1/embeddings for the same texts; bad lines go to the error
file, in OpenAI's shape, and never fail the batch; a batch cancelled halfway answers each
custom_id once, in the output or the error file; another API key sees none of it.
"""

from __future__ import annotations

import base64
import io
import json
import time

import numpy as np
import openai
import pytest

from funnel.scripts.stack import Stack
from tests.support import http, wait_for

TEXT = "text-embedding"
KEY, OTHER = "batch-key", "other-key"


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, models=[TEXT], workers=[TEXT],
               web_env={"FUNNEL_API_KEYS": f"alice={KEY},bob={OTHER}", "FUNNEL_MAX_ITEMS": "8"},
               worker_env={"FUNNEL_BATCH_SIZE": "8"}, log_dir=tmp_path_factory.mktemp("batches")) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack):
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0) as made:
        yield made


def line(custom_id: str, body: dict, url: str = "/v1/embeddings") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def embed(model: str, given, **extra) -> dict:
    return {"model": model, "input": given, "encoding_format": "float", **extra}


def upload(client, lines: list[str]):
    return client.files.create(file=("requests.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")


def final(client, batch_id: str, timeout_s: float = 120):
    return wait_for(lambda: (lambda b: b if b.status in ("completed", "cancelled", "failed") else None)(
        client.batches.retrieve(batch_id)), timeout_s=timeout_s, interval_s=0.2, what="batch final")


def json_lines(client, file_id: str | None) -> list[dict]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()] if file_id else []


def reference(client, texts: list[str]) -> np.ndarray:
    return np.array([d.embedding for start in range(0, len(texts), 8)  # FUNNEL_MAX_ITEMS a request
                     for d in client.embeddings.create(model=TEXT, input=texts[start:start + 8],
                                                       encoding_format="float").data], np.float32)


def vectors(answer: dict) -> np.ndarray:
    data = answer["data"]
    if isinstance(data[0]["embedding"], str):
        return np.array([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in data])
    return np.array([d["embedding"] for d in data], np.float32)


def test_a_batch_answers_each_custom_id_as_the_embeddings_route_does(client):
    texts = [f"batch sentence {i}: {'the quick brown fox ' * (i % 5)}" for i in range(40)]
    lines = [line(f"req-{i}", embed(TEXT, texts[i])) for i in range(30)]
    lines.append(line("several", embed(TEXT, texts[30:36])))
    lines.append(line("b64", {"model": TEXT, "input": texts[36:38], "encoding_format": "base64"}))
    bad = ["{not json", line("req-0", embed(TEXT, "again")), line("no-model", embed("no-such-model", "x")),
           line("empty", embed(TEXT, [])), line("wrong-url", embed(TEXT, "x"), url="/v1/chat/completions"),
           json.dumps({"custom_id": "get", "method": "GET", "url": "/v1/embeddings", "body": embed(TEXT, "x")})]
    lines[5:5] = bad  # the refused lines among the good ones
    uploaded = upload(client, lines)
    assert uploaded.object == "file" and uploaded.purpose == "batch" and uploaded.bytes > 0
    assert client.files.retrieve(uploaded.id).filename == "requests.jsonl"
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h",
                                  metadata={"corpus": "test"})
    assert batch.object == "batch" and batch.status == "in_progress" and batch.metadata == {"corpus": "test"}
    assert batch.request_counts.total == len(lines)
    done = final(client, batch.id)
    assert done.status == "completed" and done.completed_at and done.model == TEXT
    assert done.request_counts.completed == 32 and done.request_counts.failed == len(bad)
    output, errors = json_lines(client, done.output_file_id), json_lines(client, done.error_file_id)
    by_id = {o["custom_id"]: o for o in output}
    assert len(by_id) == len(output) == 32  # each answered once
    expected = reference(client, texts[:38])
    for i in range(30):
        answer = by_id[f"req-{i}"]
        assert answer["error"] is None and answer["response"]["status_code"] == 200
        np.testing.assert_allclose(vectors(answer["response"]["body"])[0], expected[i], atol=1e-5)
    np.testing.assert_allclose(vectors(by_id["several"]["response"]["body"]), expected[30:36], atol=1e-5)
    np.testing.assert_allclose(vectors(by_id["b64"]["response"]["body"]), expected[36:38], atol=1e-5)
    assert by_id["several"]["response"]["body"]["usage"]["prompt_tokens"] > 6
    assert [e["custom_id"] for e in errors] == [None, "req-0", "no-model", "empty", "wrong-url", "get"]
    assert errors[0]["response"] is None and errors[0]["error"]["code"] == "invalid_json_line"
    assert errors[1]["error"]["code"] == "duplicate_custom_id"
    assert errors[2]["response"]["status_code"] == 400  # one model a batch: the first good line's
    assert errors[2]["response"]["body"]["error"]["code"] == "mismatched_model"
    assert errors[3]["response"]["status_code"] == 400 and errors[3]["response"]["body"]["error"]["param"] == "input"
    assert errors[4]["error"]["code"] == "mismatched_url" and errors[5]["error"]["code"] == "invalid_method"
    assert client.files.retrieve(done.output_file_id).bytes == len(client.files.content(done.output_file_id).content)


def test_lists_page_by_after_newest_first(client):
    made = []
    for i in range(3):
        uploaded = upload(client, [line(f"l{i}", embed(TEXT, f"listed {i}"))])
        made.append(client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                          completion_window="24h").id)
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    following = client.batches.list(limit=2, after=first.data[-1].id)
    assert following.data[0].id == made[0]
    assert [b.id for b in client.batches.list(limit=2)][:3] == made[::-1]
    files = client.files.list(limit=2)
    assert len(files.data) == 2 and files.data[0].id > files.data[1].id


def test_a_batch_cancelled_halfway_answers_each_custom_id_once(client):
    lines = [line(f"c{i}", embed(TEXT, f"cancel me {i}: {'lorem ipsum ' * (i % 9)}")) for i in range(3000)]
    batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint="/v1/embeddings",
                                  completion_window="24h")
    wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 100, timeout_s=60,
             interval_s=0.05, what="batch under way")
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at
    settled = final(client, batch.id, timeout_s=30)  # cancelling: until what workers held is answered
    assert settled.status == "cancelled" and settled.cancelled_at
    assert settled.request_counts.completed + settled.request_counts.failed == 3000
    output, errors = json_lines(client, settled.output_file_id), json_lines(client, settled.error_file_id)
    ids = [o["custom_id"] for o in output] + [e["custom_id"] for e in errors]
    assert sorted(ids) == sorted(f"c{i}" for i in range(3000))  # each once, answered or told why
    assert 100 <= len(output) < 3000
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}


def test_another_key_sees_none_of_it(stack, client):
    uploaded = upload(client, [line("mine", embed(TEXT, "private"))])
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key=OTHER, max_retries=0) as other:
        for call in (lambda: other.batches.retrieve(batch.id), lambda: other.files.content(uploaded.id),
                     lambda: other.batches.cancel(batch.id),
                     lambda: other.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                                  completion_window="24h")):
            with pytest.raises(openai.NotFoundError):
                call()
        assert batch.id not in [b.id for b in other.batches.list()]
    assert http("GET", f"{stack.url}/v1/batches/{batch.id}")[0] == 401


def test_refusals(client):
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", io.BytesIO(b"\n\n")), purpose="batch")
    only_bad = upload(client, ["{nope", line("x", embed("no-such-model", "x"))])
    with pytest.raises(openai.BadRequestError, match="no line of the file"):
        client.batches.create(input_file_id=only_bad.id, endpoint="/v1/embeddings", completion_window="24h")
    good = upload(client, [line("x", embed(TEXT, "x"))])
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve(f"batch_{int(time.time() * 1000):012x}{'0' * 20}")
    with pytest.raises(openai.APIStatusError, match="410"):  # an id of a time past the TTL: expired
        client.batches.retrieve("batch_" + "0" * 32)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.batches.retrieve("nonsense")
    assert unknown.value.code == "unknown_batch"  # not the embeddings route's model_not_found
    with pytest.raises(openai.NotFoundError) as unknown:
        client.files.content("file-nonsense")
    assert unknown.value.code == "unknown_file"
    client.files.delete(good.id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(good.id)


def test_a_path_or_method_it_lacks_answers_in_openai_shape(stack, client):
    """Routing's own 404 and 405 under OpenAI's paths, in its shape as the rest of their answers."""
    auth = {"Authorization": f"Bearer {KEY}"}
    for method, path, status in (("DELETE", "/v1/batches", 405), ("PUT", "/v1/files", 405),
                                 ("GET", "/v1/files/file-x/content/more", 404), ("GET", "/v1/batches/b/c/d", 404),
                                 ("GET", "/v1/embeddings", 405), ("PUT", "/v1/embeddings", 405)):
        got, body, headers = http(method, f"{stack.url}{path}", headers=auth)
        assert got == status, (method, path, body)
        assert status == 404 or "POST" in headers["Allow"], (method, path, headers)
        assert body["error"]["type"] == "invalid_request_error" and "param" in body["error"], (method, path, body)
    with pytest.raises(openai.NotFoundError) as missing:  # the SDK reads it as any other 404
        client.get("/files/file-x/content/more", cast_to=object)
    assert missing.value.type == "invalid_request_error"
    status, body, _ = http("DELETE", f"{stack.url}/v1/models", headers=auth)  # elsewhere, Funnel's shape
    assert status == 405 and set(body["error"]) == {"code", "message"}, body
