import pytest

from funnel.web.settings import WebSettings
from funnel.worker.settings import WorkerSettings


def test_defaults():
    s = WebSettings.load([])
    assert (s.host, s.port, s.request_timeout_s, s.models) == ("127.0.0.1", 8000, 30.0, [])


def test_environment_then_flags(monkeypatch):
    monkeypatch.setenv("FUNNEL_PORT", "9001")
    monkeypatch.setenv("FUNNEL_MODELS", "a, b")
    monkeypatch.setenv("FUNNEL_API_KEYS", "k1,k2")
    s = WebSettings.load([])
    assert s.port == 9001 and s.models == ["a", "b"] and s.api_keys == ["k1", "k2"]
    assert WebSettings.load(["--port", "9002"]).port == 9002


def test_limits_follow_settings():
    s = WebSettings.load(["--max-items", "3", "--limits", "max_pixels=100,max_chars=7"])
    assert s.max_items == 3 and s.limits == ["max_pixels=100", "max_chars=7"]


def test_shared_fields_are_declared_once():
    """redis_url, prefix, model_store and log_level come from one base, same defaults in both tiers."""
    from dataclasses import fields

    from funnel.common.settings import SharedSettings

    shared = {f.name: f.default for f in fields(SharedSettings)}
    for tier in (WebSettings, WorkerSettings):
        assert issubclass(tier, SharedSettings)
        assert {f.name: f.default for f in fields(tier) if f.name in shared} == shared


def test_worker_flags_mirror_variables(monkeypatch):
    monkeypatch.setenv("FUNNEL_MODEL", "text-embedding")
    monkeypatch.setenv("FUNNEL_BATCH_SIZE", "8")
    s = WorkerSettings.load(["--linger-ms", "2.5", "--backend", "torch"])
    assert (s.model, s.batch_size, s.linger_ms, s.backend) == (["text-embedding"], 8, 2.5, "torch")
    assert s.worker_id  # generated


def test_model_given_again_serves_several(monkeypatch, tmp_path):
    monkeypatch.setenv("FUNNEL_MODEL", "from-env")
    assert WorkerSettings.load([]).model == ["from-env"]
    s = WorkerSettings.load(["--model", "a", "--model", "b:2,c"])  # flags replace the variable, and add up
    assert s.model == ["a", "b:2", "c"]
    for name in ("a", "x-one", "x-two", "y"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.json").write_text("{}")
    s = WorkerSettings.load(["--model", "a", "--models", "x-*", "--model-store", str(tmp_path)])
    assert s.served() == ["a", "x-one", "x-two"]
    monkeypatch.delenv("FUNNEL_MODEL")
    assert WorkerSettings.load(["--models", "*", "--model-store", str(tmp_path)]).served() == [
        "a", "x-one", "x-two", "y"]
    assert WorkerSettings.load(["--models", "y, x-t*", "--model-store", str(tmp_path)]).served() == ["x-two", "y"]
    with pytest.raises(SystemExit):
        WorkerSettings.load(["--model", "a", "--max-resident", "-1"])


def test_bad_values_are_refused(monkeypatch):
    monkeypatch.setenv("FUNNEL_MODEL", "m")
    with pytest.raises(SystemExit):
        WorkerSettings.load(["--backend", "tensorflow"])
    monkeypatch.setenv("FUNNEL_BATCH_SIZE", "many")
    with pytest.raises(SystemExit):
        WorkerSettings.load([])


def test_worker_needs_a_model(monkeypatch):
    monkeypatch.delenv("FUNNEL_MODEL", raising=False)
    with pytest.raises(SystemExit, match="--model"):
        WorkerSettings.load([])


def test_web_processes_default_to_one_per_two_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert WebSettings.load([]).process_count() == 8
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert WebSettings.load([]).process_count() == 2  # never fewer: one alone serializes the turnaround
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert WebSettings.load([]).process_count() == 2
    assert WebSettings.load(["--processes", "3"]).process_count() == 3


def test_nginx_closes_an_idle_upstream_connection_before_the_web_tier_does():
    """Else the web tier may close a kept-alive connection just as nginx sends it a request: a 502."""
    import re

    from funnel.scripts.front_door import TEMPLATE
    from funnel.web.server import WebServer

    upstream = re.search(r"upstream funnel_web \{(.*?)\n\}", TEMPLATE.read_text(), re.S).group(1)
    nginx_s = int(re.search(r"keepalive_timeout (\d+)s;", upstream).group(1))
    assert nginx_s < WebServer(WebSettings.load([])).cfg.keepalive
