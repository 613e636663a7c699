"""API keys guard the API; a password-protected Redis works; client input never names a key."""

import pytest

from funnel.scripts.redis_local import LocalRedis
from funnel.scripts.stack import Stack
from tests.support import http

TEXT = "text-embedding"


@pytest.fixture(scope="module")
def guarded(model_store, tmp_path_factory):
    """API keys on, and Redis behind a password."""
    with LocalRedis(password="s3cret-pass") as server, \
            Stack(model_store=model_store, models=[TEXT], redis_url=server.url,
                  log_dir=tmp_path_factory.mktemp("security"),
                  web_env={"FUNNEL_API_KEYS": "key-one,key-two"}) as stack:
        yield stack


def call(stack, path, token=None, method="GET", **kwargs):
    headers = {"Authorization": token} if token else {}
    return http(method, f"{stack.url}{path}", headers=headers, **kwargs)


@pytest.mark.parametrize("token", [None, "Bearer wrong", "Bearer key-one-and-more", "key-one",
                                   "Basic key-one", "Bearer "])
def test_without_a_valid_key_the_api_is_closed(guarded, token):
    status, body, headers = call(guarded, f"/v1/models/{TEXT}/predict", token, "POST",
                                 json_body={"text": "hi"})
    assert status == 401 and body["error"]["code"] == "unauthorized"
    assert headers["WWW-Authenticate"] == "Bearer"
    assert call(guarded, "/v1/models", token)[0] == 401


@pytest.mark.parametrize("token", ["Bearer key-one", "Bearer key-two", "bearer key-two"])
def test_a_valid_key_opens_it(guarded, token):
    status, body, _ = call(guarded, f"/v1/models/{TEXT}/predict", token, "POST", json_body={"text": "hi"})
    assert status == 200 and len(body["embedding"]) == 384  # through the password-protected Redis
    assert call(guarded, "/v1/models", token)[0] == 200


def test_health_stays_open_for_probes(guarded):
    assert call(guarded, "/healthz")[0] == 200
    assert call(guarded, "/readyz")[0] == 200


def test_wrong_redis_password_is_503_not_a_hang(model_store, tmp_path):
    with LocalRedis(password="right") as server:
        url = server.url.replace(":right@", ":wrong@")
        with Stack(model_store=model_store, models=[TEXT], workers=[], redis_url=url,
                   log_dir=tmp_path) as stack:
            status, body, headers = call(stack, f"/v1/models/{TEXT}/predict", None, "POST",
                                         json_body={"text": "hi"})
            assert status == 503 and body["error"]["code"] == "unavailable"
            assert call(stack, "/readyz")[0] == 503
