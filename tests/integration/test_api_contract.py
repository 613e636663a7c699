"""The API keeps its contract: web/openapi.json, served at /openapi.json, checked against a live stack.

Schemathesis generates requests from the document (a bounded number per
operation) and checks every answer: never a 5xx, only documented statuses and
content types, bodies that match the documented schemas. A few hand-made
requests then reach the answers generation rarely or never does (a real
image's 200, a 401, a 413, a 503 and a 504) and check them the same way.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import openai
import pytest
import schemathesis  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from funnel.scripts.stack import Stack  # noqa: E402
from tests.support import http, wait_for  # noqa: E402

KEY = "contract-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODELS = ["image-classifier", "text-embedding"]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
SPEC_FILE = Path(__file__).resolve().parents[2] / "web" / "openapi.json"
PREDICT = "POST /v1/models/{name}/predict"
# Every operation of the document but the document itself.
OPERATIONS = [f"{method.upper()} {path}"
              for path, methods in json.loads(SPEC_FILE.read_text())["paths"].items()
              for method in methods if path != "/openapi.json"]


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    """Both models, API keys on (so 401 is real), a 1 MiB body limit (so 413 is cheap to reach)."""
    with Stack(model_store=model_store, log_dir=tmp_path_factory.mktemp("contract"),
               web_env={"FUNNEL_API_KEYS": KEY, "FUNNEL_MAX_BODY_MB": "1"}) as running:
        yield running


@pytest.fixture(scope="module")
def batch_ids(stack) -> dict[str, list[str]]:
    """A finished batch with output and error files, and input files of one good line: the file and
    batch ids that generated requests name half the time, so they reach real files and batches."""
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0) as client:
        def upload(*lines: str):
            return client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch").id

        good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                           "body": {"model": "text-embedding", "input": "contract"}})
        made = client.batches.create(input_file_id=upload(good, "{not json"), endpoint="/v1/embeddings",
                                     completion_window="24h")
        done = wait_for(lambda: (lambda b: b if b.status == "completed" else None)(client.batches.retrieve(made.id)),
                        timeout_s=60, what="the batch completed")
        spare, kept = upload(good), upload(good)  # DELETE may take the spare; batches are made of the kept
        return {"file_id": [spare, done.input_file_id, done.output_file_id, done.error_file_id],
                "batch_id": [done.id], "input_file_id": [kept]}


@pytest.fixture(scope="module")
def api_schema(stack, batch_ids):
    schema = schemathesis.openapi.from_url(f"{stack.url}/openapi.json", timeout=10)

    def steered(strategy, name: str, values: list[str]):
        """Half the generated objects' `name` replaced by one of `values` (a negative case's body,
        which may be no object, as generated)."""
        chosen = st.tuples(strategy, st.sampled_from(values)).map(
            lambda pair: {**(pair[0] or {}), name: pair[1]} if isinstance(pair[0] or {}, dict) else pair[0])
        return st.one_of(chosen, strategy)

    @schema.hook
    def before_generate_path_parameters(context, strategy):
        # Half the generated predicts go to a served model, so their bodies reach the task's parser;
        # half the file and batch ids name real ones. Other path parameters (a /v2 version) keep
        # their generated values.
        path = context.operation.path
        for name, values in batch_ids.items():
            if "{" + name + "}" in path:
                return steered(strategy, name, values)
        return steered(strategy, "name", MODELS)

    @schema.hook
    def before_generate_body(context, strategy):
        if context.operation.path == "/v1/batches":  # a batch of a real input file, half the time
            return steered(strategy, "input_file_id", batch_ids["input_file_id"])
        return strategy

    return schema


def operation_of(api_schema, label: str):
    method, path = label.split(" ", 1)
    return api_schema[path][method]


@pytest.mark.parametrize("label", OPERATIONS)
def test_generated_requests_keep_the_contract(api_schema, label):
    """Requests that follow the document: answered without a 5xx, as documented, in every respect."""
    # schemathesis.pytest.from_fixture does not run under pytest 9 (it sets Function._nodeid, which
    # pytest 9 removed), so each operation's strategy runs under a plain Hypothesis test instead.
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=operation_of(api_schema, label).as_strategy())
    def generated(case):
        response = case.call_and_validate(headers=AUTH, checks=CHECKS, timeout=60)
        statuses[response.status_code] += 1

    statuses: Counter = Counter()
    generated()
    if label == PREDICT:  # the run exercised predict on the served models, not only 404s
        assert set(statuses) - {404}, f"every generated predict was a 404: {dict(statuses)}"


@pytest.mark.parametrize("label", [PREDICT, "POST /v1/files", "POST /v1/batches"])
def test_generated_bad_requests_are_refused_cleanly(api_schema, label):
    """Requests that break the document (wrong types, missing fields, bad content types): refused with
    a documented 4xx and a JSON error, never a 5xx."""
    strategy = operation_of(api_schema, label).as_strategy(generation_mode=GenerationMode.NEGATIVE)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def generated(case):
        case.call_and_validate(headers=AUTH, timeout=60, checks=[
            not_a_server_error, status_code_conformance, content_type_conformance])

    generated()


def test_the_document_is_valid_openapi_3():
    import jsonschema_rs  # a schemathesis dependency
    from schemathesis.specs.openapi.definitions import OPENAPI_30

    document = json.loads(SPEC_FILE.read_text())
    assert not [str(e) for e in jsonschema_rs.validator_for(OPENAPI_30).iter_errors(document)]


def test_the_document_is_served_as_written_and_stays_open(stack):
    status, body, headers = http("GET", f"{stack.url}/openapi.json")  # no key: open, like /healthz
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert body == json.loads(SPEC_FILE.read_text())
    assert body["openapi"].startswith("3.")
    assert {"/v1/models/{name}/predict", "/v1/models", "/healthz"} <= set(body["paths"])
    status, body, _ = http("GET", f"{stack.url}/v1/models")  # while the API itself needs the key
    assert status == 401 and body["error"]["code"] == "unauthorized"


def validate(api_schema, label: str, name: str | None = None, **kwargs) -> int:
    """Send one hand-made request through schemathesis and run every check on its answer."""
    operation = operation_of(api_schema, label)
    headers = kwargs.pop("headers", AUTH)
    case = operation.Case(path_parameters={"name": name} if name else None, **kwargs)
    response = case.call_and_validate(headers=headers, checks=[status_code_conformance,
                                                               content_type_conformance,
                                                               response_schema_conformance])
    return response.status_code


def test_real_answers_match_the_documented_schemas(api_schema, cat_jpeg):
    raw = {"body": cat_jpeg, "media_type": "image/jpeg"}
    assert validate(api_schema, PREDICT, "image-classifier", **raw) == 200
    assert validate(api_schema, PREDICT, "image-classifier", body={"file": cat_jpeg},
                    media_type="multipart/form-data") == 200
    assert validate(api_schema, PREDICT, "text-embedding", body={"text": "A man is eating food."},
                    media_type="application/json") == 200
    assert validate(api_schema, PREDICT, "text-embedding", body={"texts": ["one", "two"]},
                    media_type="application/json") == 200
    assert validate(api_schema, PREDICT, "text-embedding", body={"text": " "},
                    media_type="application/json") == 400
    assert validate(api_schema, PREDICT, "image-classifier", body={"text": "x"},
                    media_type="application/json") == 415
    assert validate(api_schema, PREDICT, "no-such-model", body={"text": "x"},
                    media_type="application/json") == 404
    assert validate(api_schema, PREDICT, "image-classifier", body=b"\xff" * (2 << 20),
                    media_type="image/jpeg") == 413
    assert validate(api_schema, "GET /v1/models") == 200
    assert validate(api_schema, "GET /v1/models", headers={}) == 401
    assert validate(api_schema, "GET /healthz", headers={}) == 200
    assert validate(api_schema, PREDICT, "text-embedding", body={"text": "x"},
                    media_type="application/json", headers={"Authorization": "Bearer wrong"}) == 401
    embeddings = "POST /v1/embeddings"  # OpenAI's shapes (tests/integration/test_openai_embeddings.py)
    for body, status in (({"model": "text-embedding", "input": ["one", "two"]}, 200),
                         ({"model": "text-embedding", "input": "x", "encoding_format": "base64"}, 200),
                         ({"model": "text-embedding", "input": [101, 102]}, 400),
                         ({"model": "image-classifier", "input": "x"}, 400),
                         ({"model": "no-such-model", "input": "x"}, 404)):
        assert validate(api_schema, embeddings, body=body, media_type="application/json") == status, body
    assert validate(api_schema, embeddings, body={"model": "text-embedding", "input": "x"},
                    media_type="application/json", headers={"Authorization": "Bearer wrong"}) == 401


def test_overload_and_deadline_answers_match_the_documented_schemas(model_store, tmp_path):
    """No worker, a queue of one and a half-second deadline: the first request times out (504)
    and leaves its job queued, so the next one finds the queue full (503)."""
    with Stack(model_store=model_store, log_dir=tmp_path, workers=[],
               web_env={"FUNNEL_MAX_QUEUE": "1", "FUNNEL_REQUEST_TIMEOUT_S": "0.5",
                        "FUNNEL_HOLD_WITHOUT_WORKERS": "1"}) as bare:
        api_schema = schemathesis.openapi.from_url(f"{bare.url}/openapi.json", timeout=10)
        text = {"body": {"text": "nobody will answer"}, "media_type": "application/json"}
        assert validate(api_schema, PREDICT, "text-embedding", headers={}, **text) == 504
        assert validate(api_schema, PREDICT, "text-embedding", headers={}, **text) == 503
        status, _, headers = http("POST", f"{bare.url}/v1/models/text-embedding/predict",
                                  json_body={"text": "again"})
        assert status == 503 and headers["Retry-After"] == "1"


def test_job_answers_match_the_documented_schemas(api_schema, cat_jpeg):
    """A bulk job of texts and one of images (multipart), its status, its JSON Lines results, a webhook
    refused (this stack has no FUNNEL_WEBHOOK_SECRET)."""
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    submit = operation_of(api_schema, "POST /v1/models/{name}/jobs")
    case = submit.Case(path_parameters={"name": "text-embedding"}, body={"texts": ["one", "two"]},
                       media_type="application/json")
    response = case.call_and_validate(headers=AUTH, checks=checks)
    assert response.status_code == 202
    job_id = response.json()["id"]
    case = submit.Case(path_parameters={"name": "image-classifier"}, body={"file": [cat_jpeg, cat_jpeg]},
                       media_type="multipart/form-data")
    response = case.call_and_validate(headers=AUTH, checks=checks)
    assert response.status_code == 202 and response.json()["progress"]["total"] == 2
    case = submit.Case(path_parameters={"name": "text-embedding"}, media_type="application/json",
                       body={"texts": ["x"], "webhook": "https://hooks.example.com/funnel"})
    response = case.call_and_validate(headers=AUTH, checks=checks)
    assert response.status_code == 400 and response.json()["error"]["code"] == "webhooks_disabled"
    status = operation_of(api_schema, "GET /v1/jobs/{id}").Case(path_parameters={"id": job_id},
                                                                 query={"limit": 2})
    assert status.call_and_validate(headers=AUTH, checks=checks).status_code == 200
    results = operation_of(api_schema, "GET /v1/jobs/{id}/results").Case(path_parameters={"id": job_id})
    response = results.call_and_validate(headers=AUTH, checks=checks)
    assert response.status_code == 200 and len(response.text.splitlines()) == 2
