"""web/auth.py without a server: FUNNEL_API_KEYS entries (`label=KEY` or a bare KEY), a request's
key found as an Identity (its label and owner hash, never the key), and the admin marking by label
or by key."""

from __future__ import annotations

import pytest
from flask import Flask

from funnel.common.bulk.jobs import Caller
from funnel.web import auth, errors
from funnel.web.settings import WebSettings

KEYS = ["alice=keyA", "bob=keyB", "ops=keyC", "bareKey", "c2VjcmV0a2V5=="]


@pytest.mark.parametrize("entry,label,key", [
    ("alice=keyA", "alice", "keyA"),
    ("team.b-2=k=with=equals", "team.b-2", "k=with=equals"),  # only the first '=' splits
    ("c2VjcmV0a2V5==", None, "c2VjcmV0a2V5=="),  # base64 padding: a bare key
    ("c2VjcmV0a2V5=", None, "c2VjcmV0a2V5="),
    ("bareKey", None, "bareKey"),
    ("not a label=key", None, "not a label=key"),
])
def test_an_entry_is_a_labelled_or_a_bare_key(entry, label, key):
    got_label, got_key = auth.split_entry(entry)
    assert got_key == key
    if label is None:  # named from its owner hash: never the key, nor any part of it
        assert got_label == f"key-{auth.owner_of(key)[:8]}" and key not in got_label
    else:
        assert got_label == label


def test_a_requests_key_is_found_as_its_identity():
    alice = auth.identify("Bearer keyA", KEYS)
    assert alice == auth.Identity(label="alice", owner=auth.owner_of("keyA"))
    assert auth.identify("bearer  bareKey ", KEYS).label.startswith("key-")
    assert len(alice.owner) == 64 and "keyA" not in alice.owner and alice.owner != auth.owner_of("keyB")
    for header in ("", "Bearer", "Bearer nope", "Basic keyA", "Bearer alice=keyA", "Bearer alice", "keyA"):
        assert auth.identify(header, KEYS) is None, header
    assert auth.identify("Bearer c2VjcmV0a2V5==", KEYS) is not None


def test_the_owner_hash_is_keyed_not_a_plain_digest():
    import hashlib

    assert auth.owner_of("keyA") != hashlib.sha256(b"keyA").hexdigest()
    assert auth.owner_of("keyA") == auth.owner_of("keyA")  # stable across processes and restarts


@pytest.mark.parametrize("admin_keys,admins", [
    (["ops"], {"ops=keyC"}),                              # by label
    (["keyB"], {"bob=keyB"}),                             # by key
    (["ops=keyC", "alice"], {"ops=keyC", "alice=keyA"}),  # as its entry, and by label
    (["bareKey"], {"bareKey"}),
    ([f"key-{auth.owner_of('bareKey')[:8]}"], {"bareKey"}),  # a bare key's label
    ([], set()),
    (["nobody"], set()),
])
def test_admin_keys_name_api_keys_by_label_or_key(admin_keys, admins):
    settings = WebSettings(api_keys=KEYS, admin_keys=admin_keys)
    marked = {entry for entry in KEYS
              if auth.is_admin(auth.identify(f"Bearer {auth.split_entry(entry)[1]}", KEYS), settings)}
    assert marked == admins
    assert not auth.is_admin(None, settings)


def test_a_request_is_a_caller_once_its_key_is_found():
    settings = WebSettings(api_keys=KEYS, admin_keys=["ops"])
    app = Flask(__name__)
    errors.install(app)
    auth.install(app, settings.api_keys)
    seen: list[Caller] = []
    app.add_url_rule("/who", "who", lambda: (seen.append(auth.caller(settings)), "")[1])
    client = app.test_client()
    assert client.get("/who").status_code == 401
    assert client.get("/who", headers={"Authorization": "Bearer x"}).status_code == 401
    assert client.get("/who", headers={"Authorization": "Bearer keyA"}).status_code == 200
    assert client.get("/who", headers={"Authorization": "Bearer keyC"}).status_code == 200
    assert seen == [Caller(owner=auth.owner_of("keyA"), label="alice"),
                    Caller(owner=auth.owner_of("keyC"), label="ops", admin=True)]


def test_without_api_keys_every_request_is_anyone():
    settings = WebSettings()
    app = Flask(__name__)
    with app.test_request_context("/", headers={"Authorization": "Bearer whatever"}):
        assert auth.caller(settings) == Caller.anyone()
