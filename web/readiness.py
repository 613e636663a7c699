"""Which served models have a live worker: what /v2's probes and gRPC's ask of the registry."""

from __future__ import annotations

from funnel.common.contracts import registry
from funnel.web.pipeline import Pipeline


def models_without_workers(pipeline: Pipeline) -> list[str]:
    """The served models no live worker serves (the server is ready when there are none; an unloaded
    model is not served); raises redis.RedisError when Redis does not answer."""
    workers = registry.live_workers(pipeline.client, pipeline.keys)
    return sorted(name for name, versions in ((n, pipeline.catalog.versions(n)) for n in pipeline.catalog.names())
                  if set(versions) - pipeline.versions.unloaded(name) and not registry.versions_live(workers, name))


def model_live(pipeline: Pipeline, name: str, model_version: str | None) -> bool:
    """Whether a live worker serves the model (that version, if one is named); 404 for a model or
    version not served."""
    pipeline.resolve(name, model_version)
    live = registry.versions_live(registry.live_workers(pipeline.client, pipeline.keys), name)
    return bool(live) and (model_version is None or int(model_version) in live)
