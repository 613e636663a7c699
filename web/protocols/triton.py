"""A model version's configuration and statistics in Triton's shapes (its model_config.proto and
grpc_service.proto, as JSON the way Triton's HTTP endpoints write them), so Triton's own tools
(perf_analyzer, tritonclient's get_model_config and get_inference_statistics) read Funnel.

Nothing is made up: the configuration comes from the version's model.json (its task) and the
registry's live workers; the statistics from what its workers added up in Redis
(common/contracts/statistics.py). Each is a plain dict; the gRPC service parses the same dicts into
Triton's messages (web/grpc/service.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from funnel.common.contracts import statistics
from funnel.common.contracts.statistics import FAIL, INFER_NS, INPUT_NS, OUTPUT_NS, QUEUE_NS, SUCCESS
from funnel.common.tasks import Task
from funnel.web.protocols import v2

# The registry's backend (worker/backend.py's name) as Triton's platform and backend.
PLATFORMS = {"onnx": ("onnxruntime_onnx", "onnxruntime"), "torch": ("pytorch_libtorch", "pytorch"),
             "python": ("", "python")}


def data_type(datatype: str) -> str:
    """A protocol datatype (FP32, BYTES) as model_config.proto's DataType (TYPE_FP32, TYPE_STRING)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def tensor(entry: Mapping[str, Any], scalar: bool = False) -> dict[str, Any]:
    """A metadata tensor ([-1, ...], the batch first) as a config tensor: its dims without the batch; an
    input of one element an item (scalar) says the task takes it reshaped to [], as Triton's configs do."""
    out = {"name": entry["name"], "data_type": data_type(entry["datatype"]), "dims": list(entry["shape"][1:])}
    return {**out, "reshape": {"shape": []}} if scalar else out


def model_config(task: Task, workers: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """GET /v2/models/<name>[/versions/<n>]/config: the version's tensors and batch size (model.json),
    and from its live workers (registry hashes) what runs it, on which devices, lingering how long."""
    meta = v2.metadata(task, [task.spec.version])
    config: dict[str, Any] = {"name": task.spec.name, "max_batch_size": task.spec.batch_size,
                              "input": [tensor(entry, entry["name"] == v2.BYTES_INPUT[task.input_kind])
                                        for entry in meta["inputs"]],
                              "output": [tensor(entry) for entry in meta["outputs"]],
                              "dynamic_batching": {}, "instance_group": []}
    backends = Counter(worker.get("backend", "") for worker in workers)
    if backends:
        platform, backend = PLATFORMS.get(backends.most_common(1)[0][0], ("", ""))
        config |= {"platform": platform, "backend": backend}
    lingers = [float(worker["linger_ms"]) for worker in workers if worker.get("linger_ms")]
    if lingers:  # the longest any of them waits for a batch to fill
        config["dynamic_batching"] = {"max_queue_delay_microseconds": int(max(lingers) * 1000)}
    gpus = sorted({int(device.partition(":")[2] or 0) for device in (w.get("device", "cpu") for w in workers)
                   if device.startswith("cuda")})
    on_gpu = sum(worker.get("device", "cpu").startswith("cuda") for worker in workers)
    if len(workers) - on_gpu:
        config["instance_group"].append({"name": f"{task.spec.name}_cpu", "kind": "KIND_CPU",
                                         "count": len(workers) - on_gpu})
    if on_gpu:
        config["instance_group"].append({"name": f"{task.spec.name}_gpu", "kind": "KIND_GPU", "count": on_gpu,
                                         "gpus": gpus})
    return config


def duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


def model_statistics(name: str, version: int, totals: Mapping[str, int], caches: bool = False) -> dict[str, Any]:
    """One version's entry of GET /v2/models/<name>/stats' `model_stats`, from its totals in Redis; a version
    that caches results (caches) has no cache_hit or cache_miss: the web tier answers its hits, never a
    worker (/metrics counts them), where one that does not has none."""
    ok = totals.get(SUCCESS[0], 0)
    cache = {} if caches else {"cache_hit": duration(0, 0), "cache_miss": duration(0, 0)}
    return {
        "name": name, "version": str(version), "last_inference": totals.get(statistics.LAST, 0),
        "inference_count": totals.get(statistics.INFERENCES, 0),
        "execution_count": totals.get(statistics.EXECUTIONS, 0),
        "inference_stats": {
            "success": duration(ok, totals.get(SUCCESS[1], 0)),
            "fail": duration(totals.get(FAIL[0], 0), totals.get(FAIL[1], 0)),
            "queue": duration(ok, totals.get(QUEUE_NS, 0)),
            "compute_input": duration(ok, totals.get(INPUT_NS, 0)),
            "compute_infer": duration(ok, totals.get(INFER_NS, 0)),
            "compute_output": duration(ok, totals.get(OUTPUT_NS, 0)), **cache,
        },
        "batch_stats": [batch_statistics(size, totals) for size in statistics.batch_sizes(totals)],
    }


def batch_statistics(size: int, totals: Mapping[str, int]) -> dict[str, Any]:
    """The batches of one size: how many, and their compute times."""
    count = totals.get(statistics.batch_field(size, "count"), 0)
    return {"batch_size": size, **{step: duration(count, totals.get(statistics.batch_field(size, field), 0))
                                   for step, field in (("compute_input", INPUT_NS), ("compute_infer", INFER_NS),
                                                       ("compute_output", OUTPUT_NS))}}
