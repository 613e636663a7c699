"""What an operator sees: the worker registry, health, Prometheus metrics, inspect and redis-cli."""

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from funnel.scripts import layout
from funnel.scripts.redis_local import redis_cli_binary
from funnel.scripts.stack import Stack
from tests.support import http, metric, wait_for

TEXT, IMAGE = "text-embedding", "image-classifier"


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, log_dir=tmp_path_factory.mktemp("ops"),
               worker_env={"FUNNEL_HEARTBEAT_TTL_S": "2", "FUNNEL_LOG_BATCHES": "1"},
               web_env={"FUNNEL_ACCESS_LOG": "1"}) as running:
        yield running


@pytest.fixture(scope="module")
def loaded(stack, cat_jpeg):
    """Some traffic: 20 texts and 5 images."""
    for i in range(20):
        assert http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": f"t {i}"})[0] == 200
    for _ in range(5):
        assert http("POST", f"{stack.url}/v1/models/{IMAGE}/predict", body=cat_jpeg,
                    headers={"Content-Type": "image/jpeg"})[0] == 200
    return stack


def served(stack):
    return {m["name"]: m for m in http("GET", f"{stack.url}/v1/models")[1]["models"]}


def test_registry_lists_live_workers_with_their_figures(loaded):
    text = wait_for(lambda: (m := served(loaded)[TEXT]) and int(m["workers"][0]["items"]) >= 20 and m,
                    what="heartbeat with the run's totals")
    worker = text["workers"][0]
    for field in ("model", "backend", "device", "host", "pid", "batch_size", "linger_ms", "started",
                  "seen", "batches", "items", "errors", "infer_seconds"):
        assert field in worker, field
    assert (worker["model"], worker["backend"], worker["device"], worker["errors"]) == (TEXT, "onnx", "cpu", "0")
    assert text["queue"] == 0 and text["batch_size"] == 32


def test_describe_one_model(loaded):
    status, body, _ = http("GET", f"{loaded.url}/v1/models/{IMAGE}")
    assert status == 200 and body["name"] == IMAGE and body["task"] == "image_classification"
    assert len(body["workers"]) == 1
    assert http("GET", f"{loaded.url}/v1/models/nope")[0] == 404


def test_health_and_readiness(loaded):
    assert http("GET", f"{loaded.url}/healthz")[:2] == (200, {"status": "ok"})
    status, body, _ = http("GET", f"{loaded.url}/readyz")
    assert status == 200 and body["workers"] == 2


def test_prometheus_metrics(loaded):
    def scrape():
        return http("GET", f"{loaded.url}/metrics")[1]["_text"]

    wait_for(lambda: metric(scrape(), "funnel_worker_items_total", model=TEXT) >= 20
             and metric(scrape(), "funnel_worker_items_total", model=IMAGE) >= 5, what="worker totals")
    text = scrape()
    assert metric(text, "funnel_requests_total", model=TEXT, status="200") == 20  # summed over processes
    assert metric(text, "funnel_requests_total", model=IMAGE, status="200") == 5
    assert metric(text, "funnel_request_seconds_count", model=TEXT) == 20
    assert metric(text, "funnel_queue_wait_seconds_count", model=IMAGE) == 5
    assert metric(text, "funnel_request_batch_size_count", model=TEXT) == 20
    assert metric(text, "funnel_queue_length", model=TEXT) == 0
    assert metric(text, "funnel_workers_live", model=IMAGE) == 1
    assert metric(text, "funnel_worker_batch_size_bucket", model=IMAGE, le="+Inf") >= 1
    assert metric(text, "funnel_worker_infer_seconds_total", model=TEXT) > 0


def test_logs_one_line_per_batch_and_per_request(loaded, tmp_path_factory):
    logs = {p.name: p.read_text() for p in loaded.log_dir.glob("*.log")}
    worker_log = next(v for k, v in logs.items() if k.startswith(f"worker-{TEXT}"))
    assert re.search(r"batch model=text-embedding size=\d+ errors=0 .*infer_ms=", worker_log)
    assert re.search(r"request model=image-classifier status=200 ms=", logs["web.log"])


def test_a_worker_whose_heartbeat_lapsed_leaves_the_list(loaded):
    extra = loaded.start_worker(TEXT, FUNNEL_WORKER_ID="short-lived")
    wait_for(lambda: len(served(loaded)[TEXT]["workers"]) == 2, what="second worker listed")
    extra.send_signal(signal.SIGKILL)
    extra.wait()
    wait_for(lambda: [w["id"] for w in served(loaded)[TEXT]["workers"]] != ["short-lived"]
             and len(served(loaded)[TEXT]["workers"]) == 1, what="dead worker gone from the list")


@pytest.fixture(scope="module")
def idle(model_store, tmp_path_factory):
    """No image worker: image jobs stay queued for inspection."""
    with Stack(model_store=model_store, workers=[TEXT], log_dir=tmp_path_factory.mktemp("idle"),
               web_env={"FUNNEL_REQUEST_TIMEOUT_S": "1", "FUNNEL_HOLD_WITHOUT_WORKERS": "1"}) as running:
        yield running


def test_readiness_names_the_model_without_workers(idle):
    status, body, _ = http("GET", f"{idle.url}/readyz")
    assert status == 503 and IMAGE in body["reason"]


def test_inspect_and_redis_cli_show_the_live_state(idle, cat_jpeg):
    status, _, _ = http("POST", f"{idle.url}/v1/models/{IMAGE}/predict", body=cat_jpeg,
                        headers={"Content-Type": "image/jpeg"})
    assert status == 504  # nobody serves images: the job waits in the queue
    env_url = ["--redis-url", idle.redis_url]
    funnel = str(Path(sys.executable).parent / "funnel")
    out = subprocess.run([funnel, "inspect", *env_url], capture_output=True, text=True, check=True).stdout
    assert re.search(rf"funnel:queue:{{{IMAGE}}}:1\s+1\s+\d+\.\d+ s", out), out
    assert re.search(rf": {TEXT} onnx cpu batch 32", out), out
    shown = json.loads(subprocess.run(
        [funnel, "inspect", *env_url, "show", f"funnel:queue:{{{IMAGE}}}:1"],
        capture_output=True, text=True, check=True).stdout)
    assert shown["model"] == IMAGE and shown["items"] == [{"pixels": {"dtype": "uint8", "shape": [224, 224, 3]}}]
    assert shown["deadline_in_s"] < 0 and shown["attempt"] == 0

    def cli(*args):
        return subprocess.run([redis_cli_binary(), "-u", idle.redis_url, *args],
                              capture_output=True, text=True, check=True).stdout

    assert cli("LLEN", f"funnel:queue:{{{IMAGE}}}:1").strip() == "1"
    assert cli("LLEN", f"funnel:queue:{{{TEXT}}}:1").strip() == "0"
    raw = cli("--no-raw", "LRANGE", f"funnel:queue:{{{IMAGE}}}:1", "0", "-1")
    assert "pixels" in raw and "uint8" in raw  # msgpack keys are readable in the raw bytes
    worker_id = cli("HKEYS", "funnel:workers").split()[0]
    fields = cli("HGETALL", f"funnel:worker:{{{TEXT}}}:{worker_id}").split("\n")
    assert fields[fields.index("model") + 1] == TEXT
    expected = {f"funnel:queue:{{{IMAGE}}}:1", "funnel:workers", f"funnel:worker:{{{TEXT}}}:{worker_id}"}
    assert expected <= set(cli("--scan", "--pattern", "funnel:*").split())
    cursor_and_keys = cli("SCAN", "0", "MATCH", "funnel:*", "COUNT", "1000").split()
    assert cursor_and_keys[0] == "0" and expected <= set(cursor_and_keys[1:])


def test_workers_per_model_share_the_cores(model_store, tmp_path):
    """`funnel up --workers-per-model 2`: two live workers for the model, each with its share of
    the cores' threads and no spin-waiting, and both of them answer requests."""
    with Stack(model_store=model_store, models=[TEXT], log_dir=tmp_path, workers_per_model=2) as stack:
        assert len(stack.workers) == 2 and len(served(stack)[TEXT]["workers"]) == 2
        for worker in stack.workers:
            environ = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
            assert b"FUNNEL_SPINNING=0" in environ and b"FUNNEL_INTRA_OP_THREADS=1/2" in environ
            assert f"FUNNEL_CORE_LOCK={layout.core_lock()}".encode() in environ
        answered_by = set()
        wait_for(lambda: answered_by.add(http("POST", f"{stack.url}/v1/models/{TEXT}/predict",
                                                   json_body={"text": "which worker?"})[1]["meta"]["worker"])
                 or len(answered_by) == 2, timeout_s=30)
