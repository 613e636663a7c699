"""Triton's repository extension: the index of the store, and load and unload, in Triton's shapes.

    index    every version of every model in the store: READY where a live worker serves it,
             UNLOADING while an unloaded version still holds jobs, else UNAVAILABLE and why
    unload   marks the model's versions (or the one its `version` parameter names) unloaded
             (common/contracts/repository.py): new requests to them are answered 404 `unloaded`,
             unpinned ones go to the model's other versions; answers once the jobs they held are
             answered, or 503 `draining` past the request timeout (calling again waits again)
    load     with a `config` (the version's model.json, as JSON text) and its files as
             `file:<version>/<path>` parameters, adds that version to the store first, as `funnel
             add` does (common/adding.py); then takes the unloaded mark off its versions and answers
             once every web process serves them and a live worker serves one, or 503 `no_worker` past
             the request timeout (the version is in the store, and is served when a worker of it starts)

A worker serves the version it was started with; load and unload choose which versions the web
tier sends requests to, and never start or stop a worker. Both change how models are served: the
routes that call them ask for an admin key (web/auth.py). Parameters come as Triton's clients send
them: HTTP's JSON `parameters` (files in base64), gRPC's parameters map (files as bytes).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from funnel.common import adding
from funnel.common.contracts import registry, repository
from funnel.common.contracts.keys import check_name
from funnel.common.errors import BadInput, NotFound, NoWorker, Unavailable
from funnel.common.store import list_versions
from funnel.web.catalog import RESCAN_S
from funnel.web.pipeline import Pipeline
from funnel.web.queueing.shedding import REFRESH_S

POLL_S = 0.05  # how often a drain or a load looks again


def index(pipeline: Pipeline, ready_only: bool = False) -> list[dict[str, str]]:
    """Every version of every model in the store as Triton's index lists it: {name, version, state,
    reason} (ready_only: the READY ones)."""
    client, keys = pipeline.client, pipeline.keys
    workers = registry.live_workers(client, keys)
    entries = []
    for name in sorted(pipeline.catalog.names()):
        live, unloaded = registry.versions_live(workers, name), repository.read(client, keys, name)
        for version in sorted(pipeline.catalog.versions(name)):
            if version in unloaded:
                held = repository.holding(client, keys, name, [version])
                state, reason = ("UNLOADING", f"{held} jobs still to answer") if held else ("UNAVAILABLE", "unloaded")
            elif version in live:
                state, reason = "READY", ""
            else:
                state, reason = "UNAVAILABLE", "no live worker serves it"
            if state == "READY" or not ready_only:
                entries.append({"name": name, "version": str(version), "state": state, "reason": reason})
    return entries


def unload(pipeline: Pipeline, name: str, parameters: Mapping[str, Any], timeout_s: float) -> None:
    """Unload the model's versions (or the one `version` names) and wait until they hold no job."""
    versions = _chosen(pipeline, name, parameters)
    client, keys = pipeline.client, pipeline.keys
    repository.unload(client, keys, name, versions)
    held = [0]

    def drained() -> bool:
        held[0] = repository.holding(client, keys, name, versions)
        return not held[0]

    # Every web process reads the mark within REFRESH_S; a job pushed before that is waited for too.
    _wait(drained, REFRESH_S, timeout_s, lambda: Unavailable(
        f"{name} is unloaded, and its versions {_listed(versions)} still hold {held[0]} jobs; call unload again "
        "to wait for them", code="draining", retry_after=5))


def load(pipeline: Pipeline, name: str, parameters: Mapping[str, Any], timeout_s: float) -> None:
    """Add the version the parameters carry, if any; serve the model's versions (or the one `version`
    names) again; wait until a live worker serves one."""
    added = _add(pipeline, name, parameters)
    versions = [added] if added else _chosen(pipeline, name, parameters)
    client, keys = pipeline.client, pipeline.keys
    repository.load(client, keys, name, versions)
    # Answered once every web process has read the store (a version added: within RESCAN_S) and the mark
    # gone (within REFRESH_S), and a worker serves it.
    _wait(lambda: bool(registry.versions_live(registry.live_workers(client, keys), name) & set(versions)),
          RESCAN_S if added else REFRESH_S, timeout_s, lambda: NoWorker(name, max(versions)))


def _wait(done: Callable[[], bool], settle_s: float, timeout_s: float, timed_out: Callable[[], Exception]) -> None:
    """Until done(), asked once settle_s has passed and every POLL_S after; timed_out() past timeout_s."""
    settled_at, deadline = time.monotonic() + settle_s, time.monotonic() + timeout_s
    while not (time.monotonic() >= settled_at and done()):
        if time.monotonic() >= deadline:
            raise timed_out()
        time.sleep(POLL_S)


def _chosen(pipeline: Pipeline, name: str, parameters: Mapping[str, Any]) -> list[int]:
    """The versions a call names: the one its `version` parameter gives, else every version in the store."""
    stored = pipeline.stored(name)
    if "version" not in parameters:
        return sorted(stored)
    version = _version(parameters["version"])
    if version not in stored:
        raise NotFound(f"{name} has no version {version}; it has {_listed(stored)}", code="unknown_version")
    return [version]


def _add(pipeline: Pipeline, name: str, parameters: Mapping[str, Any]) -> int | None:
    """The version a load's config and files add to the store (None when it carries neither)."""
    files = {key.removeprefix("file:"): value for key, value in parameters.items() if key.startswith("file:")}
    if "config" not in parameters and not files:
        return None
    meta = _config(pipeline, name, parameters)
    store = pipeline.catalog.store
    placed = {_place(path): _content(path, value) for path, value in files.items()}
    named = {version for version, _ in placed}
    if len(named) > 1:
        raise BadInput(f"the files name versions {_listed(named)}: one load adds one version", code="bad_model")

    def build(folder: Path) -> dict[str, Any]:
        for (_, relative), content in placed.items():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_bytes(content)
        return {key: value for key, value in meta.items() if key != "name"}

    try:
        with _adding_to(store, name):
            stored = list_versions(store, name)
            version = named.pop() if named else max(stored, default=0) + 1
            if version in stored:
                raise BadInput(f"{name} already has version {version}; a version in the store is not replaced: "
                               "add a new one", code="version_exists", status=409)
            adding.add(store, name, build, version)
    except ValueError as exc:
        raise BadInput(str(exc), code="bad_model") from None
    except OSError as exc:  # a store mounted read-only, a full disk
        raise Unavailable(f"the model store cannot be written here: {exc}", code="store_unwritable") from None
    pipeline.catalog.rescan()  # this process serves it at once; the others at their next rescan
    return version


def _config(pipeline: Pipeline, name: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A load's config, the new version's model.json, for a name this server may serve."""
    if "config" not in parameters:
        raise BadInput("files come with their config: the version's model.json, as JSON text", code="bad_model")
    try:
        meta = json.loads(parameters["config"])
    except (TypeError, ValueError) as exc:
        raise BadInput(f"config is the version's model.json, as JSON text: {exc}", code="bad_model") from None
    if not isinstance(meta, dict):
        raise BadInput("config is the version's model.json: a JSON object", code="bad_model")
    try:
        check_name(name)
    except ValueError as exc:
        raise BadInput(str(exc), code="bad_model") from None
    if pipeline.catalog.names_given and name not in pipeline.catalog.names_given:
        raise BadInput(f"this server serves only {', '.join(pipeline.catalog.names_given)} (FUNNEL_MODELS)",
                       code="not_served")
    return meta


@contextlib.contextmanager
def _adding_to(store: Path, name: str) -> Iterator[None]:
    """One load at a time adds to a model, across this host's web processes: two loads of the same new
    version would both find it absent, then write it in one folder."""
    with open(store / f".{name}.lock", "w") as lock:  # a dot file: never taken for a model
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _place(path: str) -> tuple[int, PurePosixPath]:
    """`<version>/<path inside it>`: the version and the file's place in its folder, never outside it."""
    head, _, rest = path.partition("/")
    relative = PurePosixPath(rest)
    if not (head.isascii() and head.isdigit() and int(head) >= 1) or not rest or relative.is_absolute() \
            or any(part in ("", ".", "..") for part in rest.split("/")) or relative.name == "model.json":
        raise BadInput(f"a file parameter is file:<version>/<path inside the version's folder, never outside it>, "
                       f"not file:{path} (model.json is the config)", code="bad_model")
    return int(head), relative


def _content(path: str, value: Any) -> bytes:
    """A file's bytes: gRPC sends them as bytes, HTTP as base64 text."""
    if isinstance(value, bytes):
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (TypeError, ValueError, binascii.Error):
        raise BadInput(f"file:{path} is not base64", code="bad_model") from None


def _version(value: Any) -> int:
    text = str(value)
    if isinstance(value, bool) or not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise BadInput(f"version is a positive integer, not {value!r}", code="bad_version")
    return int(text)


def _listed(versions) -> str:
    return ", ".join(map(str, sorted(versions)))

