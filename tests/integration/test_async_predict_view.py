"""web/routes/jobs.py's predict_async view in the Flask app, against a real redis-server and no
worker: the front hands Flask the predicts that ask for a job, and Flask routes them to it;
`Prefer: respond-async` makes a job (202), a Webhook-URL alone is a 400, and a predict asking for
neither is never made a job (the front answers those itself: tests/integration/test_front.py)."""

from __future__ import annotations

import pytest

from funnel.common.contracts.keys import Keys
from tests.support import flask_app

PREFIX = "async-view-test"
TEXT = "/v1/models/text-embedding/predict"


@pytest.fixture(scope="module")
def app(redis_server, model_store):
    return flask_app(redis_server, model_store, PREFIX, "--models", "text-embedding")


@pytest.fixture()
def client(redis_client):
    return redis_client


def test_flask_routes_a_predict_to_the_async_view(app):
    endpoint, args = app.url_map.bind("localhost").match(TEXT, method="POST")
    assert (endpoint, args) == ("predict_async", {"name": "text-embedding"})


def test_respond_async_makes_a_job(app, client):
    answer = app.test_client().post(TEXT, json={"texts": ["later", "much later"]},
                                    headers={"Prefer": "wait=5, respond-async", "Idempotency-Key": "view-1"})
    assert answer.status_code == 202, answer.json
    assert answer.headers["Preference-Applied"] == "respond-async"
    job_id = answer.json["id"]
    assert answer.headers["Location"] == f"/v1/jobs/{job_id}" and answer.json["progress"]["total"] == 2
    keys = Keys(PREFIX)
    assert client.llen(keys.bulk("text-embedding")) == 2 and client.exists(keys.job(job_id))
    again = app.test_client().post(TEXT, json={"texts": ["later", "much later"]},
                                   headers={"Prefer": "respond-async", "Idempotency-Key": "view-1"})
    assert again.status_code == 202 and again.json["id"] == job_id
    assert again.headers["Idempotent-Replayed"] == "true"


def test_a_webhook_without_respond_async_is_a_400(app, client):
    answer = app.test_client().post(TEXT, json={"text": "now"}, headers={"Webhook-URL": "https://example.com/hook"})
    assert answer.status_code == 400 and answer.json["error"]["code"] == "bad_webhook"
    assert client.dbsize() == 0


def test_an_unknown_model_is_a_404(app, client):
    answer = app.test_client().post("/v1/models/nope/predict", json={"text": "now"},
                                    headers={"Prefer": "respond-async"})
    assert answer.status_code == 404 and answer.json["error"]["code"] == "unknown_model"


@pytest.mark.parametrize("headers", [{}, {"Prefer": "return=minimal"}])
def test_a_predict_asking_for_no_job_is_not_made_one(app, client, headers):
    answer = app.test_client().post(TEXT, json={"text": "now"}, headers=headers)
    assert answer.status_code != 202, answer.json
    assert not client.keys(f"{PREFIX}:job:*") and not client.llen(Keys(PREFIX).bulk("text-embedding"))
