"""What a model version's configuration and statistics read of Redis (its live workers, its totals), for
/v2's routes (web/routes/v2.py) and the gRPC service alike; web/protocols/triton.py renders them."""

from __future__ import annotations

from typing import Any

from funnel.common.contracts import registry, statistics
from funnel.common.tasks import Task
from funnel.web.pipeline import Pipeline
from funnel.web.protocols import triton


def model_config(pipeline: Pipeline, name: str, version: str | None) -> dict[str, Any]:
    """The version's configuration (none named: the highest); 404 for a model or version not served.
    Raises redis.RedisError when Redis does not answer."""
    task = pipeline.resolve(name, version or str(max(pipeline.catalog.versions(name) or [1])))
    workers = [worker for worker in registry.live_workers(pipeline.client, pipeline.keys)
               if worker.get("model") == name and registry.version_of(worker) == task.spec.version
               and registry.resident(worker)]
    return triton.model_config(task, workers)


def model_statistics(pipeline: Pipeline, name: str = "", version: str | None = None) -> dict[str, Any]:
    """{"model_stats": [...]} of one version, every version of a model, or (no name) every served model's;
    404 for a model or version not served."""
    names = [name] if name else pipeline.catalog.names()
    wanted: dict[str, list[Task]] = {}
    for model in names:
        wanted[model] = [pipeline.resolve(model, version)] if version \
            else [task for _, task in sorted(pipeline.catalog.versions(model).items())] or [pipeline.resolve(model)]
    stats = []
    for model, tasks in wanted.items():
        totals = statistics.read(pipeline.client, pipeline.keys, model, [task.spec.version for task in tasks])
        stats += [triton.model_statistics(model, task.spec.version, totals[task.spec.version], task.cache.on)
                  for task in tasks]
    return {"model_stats": stats}
