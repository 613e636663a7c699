"""Which served models have a live worker: what /v2's probes, its repository index and gRPC's ask of
the registry."""

from __future__ import annotations

from funnel.common.contracts import registry
from funnel.web.pipeline import Pipeline


def models_without_workers(pipeline: Pipeline) -> list[str]:
    """The served models no live worker serves (the server is ready when there are none); raises
    redis.RedisError when Redis does not answer."""
    workers = registry.live_workers(pipeline.client, pipeline.keys)
    return sorted(name for name in pipeline.catalog.names() if not registry.versions_live(workers, name))


def model_live(pipeline: Pipeline, name: str, model_version: str | None) -> bool:
    """Whether a live worker serves the model (that version, if one is named); 404 for a model or
    version not served."""
    pipeline.resolve(name, model_version)
    live = registry.versions_live(registry.live_workers(pipeline.client, pipeline.keys), name)
    return bool(live) and (model_version is None or int(model_version) in live)


def repository_index(pipeline: Pipeline, ready_only: bool = False) -> list[dict[str, str]]:
    """Every version of every served model, in Triton's repository index shape: {name, version, state,
    reason}, READY where a live worker serves it, else UNAVAILABLE and why (ready_only: the READY ones)."""
    workers = registry.live_workers(pipeline.client, pipeline.keys)
    index = []
    for name in sorted(pipeline.catalog.names()):
        live = registry.versions_live(workers, name)
        for version in sorted(pipeline.catalog.versions(name)):
            ready = version in live
            if ready or not ready_only:
                index.append({"name": name, "version": str(version), "state": "READY" if ready else "UNAVAILABLE",
                              "reason": "" if ready else "no live worker serves it"})
    return index
