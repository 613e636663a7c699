"""Triton's model configuration and statistics, from model.json, the registry and a batch's figures:
what a batch adds to its version's totals, and how the totals and the workers read in Triton's shapes."""

from __future__ import annotations

import pytest

from funnel.common import tasks
from funnel.common.contracts import statistics
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.statistics import BatchFigures, increments
from funnel.common.store import load_spec
from funnel.web.protocols import triton


@pytest.fixture(scope="module")
def text_task(model_store):
    return tasks.load(load_spec(model_store, "text-embedding"), {"max_chars": 200})


def test_a_batch_adds_its_jobs_items_and_steps():
    figures = BatchFigures(items=5, ok_ns=[10, 20], failed_ns=[7], queue_ns=4, collate_ns=100, run_ns=1000,
                           finish_ns=10)
    assert increments(figures) == {
        "success": 2, "success_ns": 30, "fail": 1, "fail_ns": 7, "queue_ns": 4, "input_ns": 200,
        "infer_ns": 2000, "output_ns": 20, "inferences": 5, "executions": 1,
        "b5.count": 1, "b5.input_ns": 100, "b5.infer_ns": 1000, "b5.output_ns": 10}


def test_a_batch_that_ran_nothing_adds_its_failures_only():
    figures = BatchFigures(items=0, ok_ns=[], failed_ns=[3], queue_ns=0, collate_ns=0, run_ns=0, finish_ns=0)
    assert increments(figures) == {"fail": 1, "fail_ns": 3}
    assert statistics.commands(Keys(), "m", 2, {}, 5) == []
    assert statistics.commands(Keys(), "m", 2, {"fail": 1}, 5) == [
        ("HINCRBY", "funnel:stats:{m}:2", "fail", 1), ("HSET", "funnel:stats:{m}:2", "last", 5)]


def test_totals_read_as_tritons_model_statistics():
    totals = {"success": 3, "success_ns": 90, "queue_ns": 9, "input_ns": 3, "infer_ns": 60, "output_ns": 6,
              "inferences": 4, "executions": 2, "last": 1234, "b1.count": 0, "b3.count": 1, "b3.infer_ns": 20,
              "b1.infer_ns": 0, "b2.count": 1}
    stats = triton.model_statistics("m", 2, totals)
    assert stats["version"] == "2" and stats["last_inference"] == 1234
    assert (stats["inference_count"], stats["execution_count"]) == (4, 2)
    assert stats["inference_stats"]["success"] == {"count": 3, "ns": 90}
    assert stats["inference_stats"]["compute_infer"] == {"count": 3, "ns": 60}
    assert stats["inference_stats"]["fail"] == {"count": 0, "ns": 0}
    assert [b["batch_size"] for b in stats["batch_stats"]] == [1, 2, 3]
    assert stats["batch_stats"][2]["compute_infer"] == {"count": 1, "ns": 20}
    assert "cache_hit" in stats["inference_stats"]
    assert "cache_hit" not in triton.model_statistics("m", 2, totals, caches=True)["inference_stats"]


def test_config_from_model_json_and_the_live_workers(text_task):
    workers = [{"backend": "onnx", "device": "cpu", "linger_ms": "5"},
               {"backend": "onnx", "device": "cuda:1", "linger_ms": "2.5"},
               {"backend": "onnx", "device": "cuda:0", "linger_ms": "5"}]
    config = triton.model_config(text_task, workers)
    assert (config["platform"], config["backend"], config["max_batch_size"]) == ("onnxruntime_onnx", "onnxruntime", 32)
    assert config["input"] == [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}]
    assert config["output"] == [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}]
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 5000}
    assert config["instance_group"] == [
        {"name": "text-embedding_cpu", "kind": "KIND_CPU", "count": 1},
        {"name": "text-embedding_gpu", "kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}]


def test_config_without_a_live_worker_names_no_runtime(text_task):
    config = triton.model_config(text_task, [])
    assert "platform" not in config and config["instance_group"] == [] and config["dynamic_batching"] == {}
    assert triton.model_config(text_task, [{"backend": "python", "device": "cpu"}])["backend"] == "python"
    assert triton.data_type("UINT8") == "TYPE_UINT8"
