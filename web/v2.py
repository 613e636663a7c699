"""The Open Inference Protocol (KServe V2, as Triton speaks it) beside /v1, through the same queue.

A model's tensors, as clients written for Triton and KServe send them:

- one BYTES input named after the model's input kind (IMAGE: encoded images,
  TEXT: UTF-8 strings, JSON: JSON documents), each element an item that the
  task preprocesses as /v1 does; or
- the job's own tensors, ready made: every fixed-shape input model.json lists
  (the image model's `pixels`, UINT8 [n, 224, 224, 3]), checked by the task.

A request with batch n becomes n jobs, answered with the model's own output
rows stacked to [n, ...] (FP32), or as "score:index:label" strings with the
classification extension. Errors are {"error": "<message>"}.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import orjson
import redis
from flask import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from funnel.common.errors import BadInput, FunnelError, NotFound
from funnel.common.keys import Keys
from funnel.common.registry import live_workers
from funnel.common.tasks import Inputs, Task
from funnel.common.wire import Reply
from funnel.web.errors import drain_body, retry_after
from funnel.web.gateway import Gateway
from funnel.web.inputs import served
from funnel.web.predict import reply_error
from funnel.web.shedding import request_timeout
from funnel.web.tensors import DATATYPES, NAMES_OF, Tensor, answer_body, output_entry, read_inputs, split_body

BYTES_INPUT = {"image": "IMAGE", "text": "TEXT", "json": "JSON"}
MODEL_VERSION = "1"
EXTENSIONS = ["classification", "binary_tensor_data"]


def server_version() -> str:
    try:
        return version("funnel")
    except PackageNotFoundError:
        return "unknown"


def metadata(task: Task) -> dict[str, Any]:
    """The model as GET /v2/models/<name> states it: either input form, and the raw outputs."""
    inputs: list[dict[str, Any]] = [{"name": BYTES_INPUT[task.input_kind], "datatype": "BYTES", "shape": [-1]}]
    for name, declared in fixed_inputs(task).items():
        inputs.append({"name": name, "datatype": NAMES_OF[declared["dtype"]], "shape": [-1, *declared["shape"]]})
    return {"name": task.spec.name, "versions": [MODEL_VERSION], "platform": f"funnel_{task.spec.task}",
            "inputs": inputs,
            "outputs": [{"name": name, "datatype": "FP32", "shape": [-1, *shape]}
                        for name, shape in task.output_shapes().items()],
            "parameters": {"input_forms": f"one of: {' or '.join(i['name'] for i in inputs)}"}}


def fixed_inputs(task: Task) -> dict[str, dict]:
    """The job tensors model.json declares with a fixed shape per item: a client may send them ready."""
    declared = task.spec.config.get("inputs", {})
    return {name: d for name, d in declared.items()
            if d.get("dtype") in NAMES_OF and all(n > 0 for n in d.get("shape", [-1]))}


def items_of(task: Task, tensors: dict[str, Tensor], max_items: int) -> list[Inputs]:
    """The jobs' inputs: preprocessed BYTES items, or the model's own tensors checked by the task."""
    encoded = BYTES_INPUT[task.input_kind]
    ready = fixed_inputs(task)
    unknown = set(tensors) - {encoded, *ready}
    if unknown:
        raise BadInput(f"unknown input {sorted(unknown)[0]!r}; {task.spec.name} takes {encoded} "
                       f"{'or ' + ', '.join(ready) if ready else ''}".strip(), code="bad_tensor")
    if encoded in tensors:
        if len(tensors) > 1:
            raise BadInput(f"send {encoded} or the ready tensors, not both", code="bad_tensor")
        return [task.preprocess(item) for item in encoded_items(task, tensors[encoded], max_items)]
    missing = set(ready) - set(tensors)
    if missing:
        raise BadInput(f"missing input {sorted(missing)[0]!r}", code="bad_tensor")
    n = None
    for name, declared in ready.items():
        tensor = tensors[name]
        if tensor.datatype != NAMES_OF[declared["dtype"]] or tensor.shape[1:] != declared["shape"]:
            raise BadInput(f"input {name!r} must be {NAMES_OF[declared['dtype']]} "
                           f"{[-1, *declared['shape']]}, not {tensor.datatype} {tensor.shape}", code="bad_tensor")
        n = check_batch(name, tensor.shape[0], max_items, n)
    items = [{name: np.asarray(tensors[name].value).reshape(tensors[name].shape)[i] for name in ready}
             for i in range(n or 0)]
    for item in items:
        task.check(item)
    return items


def check_batch(name: str, n: int, max_items: int, expected: int | None = None) -> int:
    if not 0 < n <= max_items:
        raise BadInput(f"input {name!r}: batch of {n}; between 1 and {max_items} items per request",
                       code="too_many_items" if n else "bad_tensor")
    if expected is not None and n != expected:
        raise BadInput(f"input {name!r}: batch of {n}, unlike the other inputs' {expected}", code="bad_tensor")
    return n


def encoded_items(task: Task, tensor: Tensor, max_items: int) -> list[Any]:
    if tensor.datatype != "BYTES" or len(tensor.shape) > 2 or tensor.shape[1:] not in ([], [1]):
        raise BadInput(f"input {tensor.name!r} must be BYTES of shape [n] or [n, 1]", code="bad_tensor")
    check_batch(tensor.name, tensor.shape[0], max_items)
    elements: list[bytes] = tensor.value  # type: ignore[assignment]
    if task.input_kind == "image":
        return elements
    try:
        texts = [e.decode("utf-8") for e in elements]
        return texts if task.input_kind == "text" else [orjson.loads(t) for t in texts]
    except (UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise BadInput(f"input {tensor.name!r}: {exc}", code="bad_tensor") from None


def requested_outputs(task: Task, header: dict) -> list[tuple[str, bool, int]]:
    """(name, as binary data, classification count) of each output to answer."""
    shapes = task.output_shapes()
    default_binary = bool((header.get("parameters") or {}).get("binary_data_output", False))
    asked = header.get("outputs")
    if asked is None:
        return [(name, default_binary, 0) for name in shapes]
    if not isinstance(asked, list):
        raise BadInput('"outputs" must be a list', code="bad_tensor")
    out = []
    for spec in asked:
        name = spec.get("name") if isinstance(spec, dict) else None
        if name not in shapes:
            raise BadInput(f"unknown output {name!r}; {task.spec.name} gives {', '.join(shapes)}", code="bad_tensor")
        parameters = spec.get("parameters") or {}
        classes = parameters.get("classification", 0)
        if not isinstance(classes, int) or isinstance(classes, bool) or classes < 0:
            raise BadInput(f"output {name!r}: classification must be a count", code="bad_tensor")
        out.append((name, bool(parameters.get("binary_data", default_binary)), classes))
    return out


def classify(rows: np.ndarray, k: int, labels) -> list[bytes]:
    """Triton's classification extension: the k best of each row as "score:index[:label]"."""
    out = []
    for row in rows.reshape(len(rows), -1):
        for i in np.argsort(-row, kind="stable")[:k]:
            out.append((f"{row[i]:f}:{i}" + (f":{labels[i]}" if labels else "")).encode())
    return out


def error_response(message: str, status: int) -> Response:
    return Response(orjson.dumps({"error": message}), status=status, mimetype="application/json")


def served_task(models: dict[str, Task], name: str, model_version: str | None) -> Task:
    task = served(models, name)
    if model_version not in (None, MODEL_VERSION):
        raise NotFound(f"{name} has version {MODEL_VERSION} only, not {model_version!r}")
    return task


def install_probes(v2: Blueprint, models: dict[str, Task], served: Callable[[str, str | None], Task],
                   client: redis.Redis, keys: Keys) -> None:
    """Server metadata, liveness and readiness, model metadata and readiness."""

    def live_models() -> set[str]:
        return {w.get("model", "") for w in live_workers(client, keys)}

    @v2.get("")
    def server_metadata():
        return {"name": "funnel", "version": server_version(), "extensions": EXTENSIONS}

    @v2.get("/health/live")
    def live():
        return {"live": True}

    @v2.get("/health/ready")
    def ready():
        missing = set(models) - live_models()
        if missing:
            return error_response(f"no live worker for {', '.join(sorted(missing))}", 503)
        return {"ready": True}

    @v2.get("/models/<name>")
    @v2.get("/models/<name>/versions/<model_version>")
    def model_metadata(name: str, model_version: str | None = None):
        return metadata(served(name, model_version))

    @v2.get("/models/<name>/ready")
    @v2.get("/models/<name>/versions/<model_version>/ready")
    def model_ready(name: str, model_version: str | None = None):
        served(name, model_version)
        if name not in live_models():
            return error_response(f"no live worker for {name}", 503)
        return {"name": name, "ready": True}


def answer_outputs(task: Task, wanted: list[tuple[str, bool, int]], replies: list[Reply]
                   ) -> tuple[list[dict], list[bytes]]:
    """The requested outputs, each the replies' rows stacked to [n, ...] or classified."""
    outputs: list[dict] = []
    chunks: list[bytes] = []
    for output, binary, classes in wanted:
        rows = np.stack([np.asarray((r.outputs or {})[output]) for r in replies]).astype(np.float32)
        if classes:
            k = min(classes, rows[0].size)
            outputs.append(output_entry(output, classify(rows, k, task.class_labels()), [len(rows), k],
                                        binary, chunks))
        else:
            outputs.append(output_entry(output, rows, list(rows.shape), binary, chunks))
    return outputs, chunks


def create_blueprint(models: dict[str, Task], gateway: Gateway, client: redis.Redis, keys: Keys,
                     timeout_s: float, max_items: int) -> Blueprint:
    v2 = Blueprint("v2", __name__, url_prefix="/v2")

    @v2.errorhandler(FunnelError)
    def protocol_error(exc: FunnelError):
        response = error_response(exc.message, exc.status)
        if exc.status == 503:
            response.headers["Retry-After"] = retry_after(exc)
        return response

    @v2.errorhandler(redis.RedisError)
    def redis_error(exc: redis.RedisError):
        return error_response(f"queue unavailable: {type(exc).__name__}", 503)

    @v2.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        if exc.code == 413:
            drain_body(request)
        return error_response(exc.description or exc.name, exc.code or 500)

    served = partial(served_task, models)
    install_probes(v2, models, served, client, keys)

    @v2.post("/models/<name>/infer")
    @v2.post("/models/<name>/versions/<model_version>/infer")
    def infer(name: str, model_version: str | None = None):
        task = served(name, model_version)
        header, binary = split_body(request.get_data(), request.headers.get("Inference-Header-Content-Length"))
        wanted = requested_outputs(task, header)
        inputs = items_of(task, read_inputs(header, binary), max_items)
        replies = gateway.submit(name, inputs, request_timeout(request.headers, timeout_s), raw=True)
        for i, reply in enumerate(replies):
            if not reply.ok:
                raise reply_error(reply, i, len(replies))
        outputs, chunks = answer_outputs(task, wanted, replies)
        answer = {"model_name": name, "model_version": MODEL_VERSION}
        if isinstance(header.get("id"), str):
            answer["id"] = header["id"]
        body, headers = answer_body(answer, outputs, chunks)
        return Response(body, headers=headers)

    return v2


__all__ = ["create_blueprint", "DATATYPES"]
