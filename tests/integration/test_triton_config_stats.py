"""Triton's model configuration and statistics, read by Triton's own tools: tritonclient.http and
tritonclient.grpc unmodified, and perf_analyzer (from tritonclient 2.40.0's wheel, scripts/install.sh),
against a live stack of the text model; the statistics agree with /metrics, counted apart."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from tests.support import SENTENCES, http, wait_for

TEXT = "text-embedding"
PERF = Path(os.environ.get("FUNNEL_PERF_ANALYZER", Path(__file__).parents[2] / ".venv" / "perf_analyzer"))


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, models=[TEXT], grpc_port=free_port(),
               log_dir=tmp_path_factory.mktemp("triton")) as running:
        yield running


@pytest.fixture(scope="module")
def over_http(stack):
    client = httpclient.InferenceServerClient(stack.url.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def over_grpc(stack):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    yield client
    client.close()


def live_workers(stack) -> list[dict[str, str]]:
    with redis.Redis.from_url(stack.redis_url) as client:
        return [w for w in registry.live_workers(client, Keys()) if w.get("model") == TEXT]


def scraped(stack) -> str:
    return http("GET", f"{stack.url}/metrics")[1]["_text"]


def infer(client, n: int) -> None:
    for i in range(n):
        text = httpclient.InferInput("TEXT", [1], "BYTES")
        text.set_data_from_numpy(np.array([f"{SENTENCES[i % len(SENTENCES)]} {i}".encode()], dtype=object))
        assert client.infer(TEXT, [text]).as_numpy("embedding").shape == (1, 384)


def test_config_over_http_and_grpc(stack, over_http, over_grpc):
    workers = live_workers(stack)
    config = over_http.get_model_config(TEXT)
    assert config["name"] == TEXT and config["max_batch_size"] == 32
    assert (config["platform"], config["backend"]) == ("onnxruntime_onnx", "onnxruntime")
    assert config["input"] == [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}]
    assert config["output"] == [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}]
    linger_us = int(float(workers[0]["linger_ms"]) * 1000)
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": linger_us}
    assert config["instance_group"] == [{"name": f"{TEXT}_cpu", "kind": "KIND_CPU", "count": len(workers)}]
    assert over_http.get_model_config(TEXT, model_version="1") == config
    by_grpc = over_grpc.get_model_config(TEXT, as_json=True)["config"]
    assert by_grpc["name"] == TEXT and by_grpc["max_batch_size"] == 32 and by_grpc["platform"] == "onnxruntime_onnx"
    assert by_grpc["input"][0]["data_type"] == "TYPE_STRING" and by_grpc["output"][0]["dims"] == ["384"]
    assert by_grpc["instance_group"][0] == {"name": f"{TEXT}_cpu", "kind": "KIND_CPU", "count": len(workers)}
    assert over_grpc.get_model_config(TEXT).config.dynamic_batching.max_queue_delay_microseconds == linger_us
    for client in (over_http, over_grpc):
        with pytest.raises(InferenceServerException):
            client.get_model_config("no-such-model")
        with pytest.raises(InferenceServerException):
            client.get_model_config(TEXT, model_version="7")


def test_statistics_count_what_was_served(stack, over_http, over_grpc):
    def success() -> int:
        return over_http.get_inference_statistics(TEXT)["model_stats"][0]["inference_stats"]["success"]["count"]

    before = success()
    infer(over_http, 12)
    wait_for(lambda: success() >= before + 12, what="the statistics to count 12 requests")
    stats = over_http.get_inference_statistics(TEXT, model_version="1")["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [(TEXT, "1")]
    counted = stats[0]
    assert counted["inference_count"] >= counted["execution_count"] >= 1 and counted["last_inference"] > 0
    durations = counted["inference_stats"]
    for step in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert durations[step]["count"] == durations["success"]["count"], step
    assert 0 < durations["compute_infer"]["ns"] < durations["success"]["ns"]
    assert sum(b["compute_infer"]["count"] for b in counted["batch_stats"]) == counted["execution_count"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in counted["batch_stats"]) \
        == counted["inference_count"]
    by_grpc = over_grpc.get_inference_statistics(TEXT, model_version="1", as_json=True)["model_stats"][0]
    assert int(by_grpc["inference_count"]) == counted["inference_count"]
    assert int(by_grpc["inference_stats"]["success"]["count"]) == durations["success"]["count"]
    everything = over_http.get_inference_statistics()["model_stats"]
    assert [s["name"] for s in everything] == [TEXT]
    status, body, _ = http("GET", f"{stack.url}/v2/models/no-such-model/stats")
    assert status == 404 and "error" in body


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include these."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{name}(?:{{(.*)}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


def perf_analyzer() -> tuple[list[str], dict[str, str]]:
    binary = PERF / "bin" / "perf_analyzer"
    if not binary.is_file():
        pytest.skip(f"no perf_analyzer at {binary} (scripts/install.sh puts it there)")
    libraries = PERF / "nvidia" / "cuda_runtime" / "lib"
    return [str(binary)], {**os.environ, "LD_LIBRARY_PATH": f"{libraries}:{os.environ.get('LD_LIBRARY_PATH', '')}"}


@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc --streaming"])
def test_perf_analyzer_runs_and_agrees_with_metrics(stack, over_http, protocol):
    command, env = perf_analyzer()
    protocol, *streaming = protocol.split()  # --streaming: ModelStreamInfer, one stream per client
    # Windows of 50 requests, not of a time: on a host busy with other work a window of a second may see
    # no request answered at 25 clients, and perf_analyzer gives up.
    url = stack.url.removeprefix("http://") if protocol == "http" else f"127.0.0.1:{stack.grpc_port}"
    scrape = scraped(stack)
    before = over_http.get_inference_statistics(TEXT)["model_stats"][0]
    run = subprocess.run([*command, "-m", TEXT, "-u", url, "-i", protocol, *streaming, "--concurrency-range", "1:32:8",
                          "--shared-memory", "none", "--measurement-mode", "count_windows",
                          "--measurement-request-count", "50", "--max-trials", "4", "--stability-percentage", "1000"],
                         capture_output=True, text=True, env=env, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    # Each level's client count against the server's own count of the same window (perf_analyzer reads it).
    clients = [int(n) for n in re.findall(r"Client:\s+Request count: (\d+)", run.stdout)]
    servers = [int(n) for n in re.findall(r"Server:\s+Inference count: (\d+)", run.stdout)]
    assert len(clients) == len(servers) == 4, run.stdout
    for clients_at, client, server in zip((1, 9, 17, 25), clients, servers):
        # Within 10%, give or take the requests in flight at a window's edges: answered on one side of
        # it by the server's count, on the other by the client's.
        assert abs(server - client) <= 0.1 * client + clients_at, run.stdout
    after = over_http.get_inference_statistics(TEXT)["model_stats"][0]
    served = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    queue_ns = after["inference_stats"]["queue"]["ns"] - before["inference_stats"]["queue"]["ns"]
    items, batches = after["inference_count"], after["execution_count"]  # both since the stack started

    def counted() -> tuple[float, float]:
        now = scraped(stack)
        return metric(now, "funnel_worker_items_total", model=TEXT), metric(now, "funnel_worker_batches_total",
                                                                            model=TEXT)

    def agreeing() -> bool:  # /metrics' worker totals lag by a heartbeat
        worker_items, worker_batches = counted()
        return abs(worker_items - items) <= 0.1 * items and abs(worker_batches - batches) <= 0.1 * batches

    wait_for(agreeing, timeout_s=15, what="/metrics' worker totals to agree with the statistics",
             detail=lambda: f"/metrics: items and batches {counted()}; statistics: {items}, {batches}")
    now = scraped(stack)
    answered = metric(now, "funnel_requests_total", model=TEXT, status="200") - metric(
        scrape, "funnel_requests_total", model=TEXT, status="200")
    waited = metric(now, "funnel_queue_wait_seconds_sum", model=TEXT) - metric(
        scrape, "funnel_queue_wait_seconds_sum", model=TEXT)
    if protocol == "http":  # the web process counts its own requests; the gRPC process's are its own
        assert abs(answered - served) <= 0.1 * served, (answered, served)
        assert abs(waited * 1e9 - queue_ns) <= 0.1 * queue_ns + 1e6 * served, (waited, queue_ns)


def test_the_repository_index_lists_every_version_and_whether_it_is_served(stack, over_http, over_grpc):
    status, listed, _ = http("POST", f"{stack.url}/v2/repository/index", json_body={})
    assert status == 200
    served = {(m["name"], m["version"]): m["state"] for m in listed}
    assert served[(TEXT, "1")] == "READY"
    assert over_http.get_model_repository_index() == listed  # tritonclient's own call, over HTTP
    by_grpc = over_grpc.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m["version"]): m["state"] for m in by_grpc} == served
    ready_only = http("POST", f"{stack.url}/v2/repository/index", json_body={"ready": True})[1]
    assert all(m["state"] == "READY" for m in ready_only)
