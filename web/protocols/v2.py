"""The Open Inference Protocol (KServe V2, as Triton speaks it) beside /v1, through the same queue.

A model's tensors, as clients written for Triton and KServe send them:

- one BYTES input named after the model's input kind (IMAGE: encoded images,
  TEXT: UTF-8 strings, JSON: JSON documents, FILE: files of the input's
  "content_type" parameter, else the task's first), each element an item that
  the task preprocesses as /v1 does; or
- the job's own tensors, ready made: every fixed-shape input model.json lists
  (the image model's `pixels`, UINT8 [n, 224, 224, 3]), checked by the task.

A request's n items are queued as one job (one per worker batch when more), answered with the model's own output
rows stacked to [n, ...] (FP32; rows of different shapes zero-padded, which the
output's parameters "padded" and "row_shapes" say), or as "score:index:label"
strings with the classification extension; an output whose rows are not numbers
(a chain's lines, each a box with its text) as BYTES, one JSON document a row. Errors are {"error": "<message>"}.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import orjson
from werkzeug.wrappers import Request

from funnel.common.contracts import priority
from funnel.common.contracts.wire import Reply
from funnel.common.errors import BadInput
from funnel.common.tasks import Task, Upload
from funnel.web import errors
from funnel.web.pipeline import Answered, Rendered, Work
from funnel.web.protocols.inputs import content_type
from funnel.web.protocols.tensors import (
    NAMES_OF,
    Tensor,
    output_entry,
    read_inputs,
    response_body,
    split_body,
    stack_rows,
)
from funnel.web.queueing.cache_plan import x_cache

log = logging.getLogger("funnel.web")

PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
BYTES_INPUT = {"image": "IMAGE", "text": "TEXT", "json": "JSON", "file": "FILE"}
EXTENSIONS = ["classification", "binary_tensor_data", "model_configuration", "statistics"]


def server_version() -> str:
    try:
        return version("funnel")
    except PackageNotFoundError:
        return "unknown"


def metadata(task: Task, versions: list[int]) -> dict[str, Any]:
    """The model as GET /v2/models/<name> states it: either input form, and the raw outputs. The encoded
    input is [-1, 1], one element an item, as Triton states a batched model's input (its dims are never
    empty, and perf_analyzer sends what they say); [n] is taken as well."""
    inputs: list[dict[str, Any]] = [{"name": BYTES_INPUT[task.input_kind], "datatype": "BYTES", "shape": [-1, 1]}]
    for name, declared in fixed_inputs(task).items():
        inputs.append({"name": name, "datatype": NAMES_OF[declared["dtype"]], "shape": [-1, *declared["shape"]]})
    return {"name": task.spec.name, "versions": [str(v) for v in versions], "platform": f"funnel_{task.spec.task}",
            "inputs": inputs,
            "outputs": [{"name": name, "datatype": "FP32", "shape": [-1, *shape]}
                        for name, shape in task.output_shapes().items()],
            "parameters": {"input_forms": f"one of: {' or '.join(i['name'] for i in inputs)}"}}


def fixed_inputs(task: Task) -> dict[str, dict]:
    """The job tensors model.json declares with a fixed shape per item: a client may send them ready."""
    declared = task.spec.config.get("inputs", {})
    return {name: d for name, d in declared.items()
            if d.get("dtype") in NAMES_OF and all(n > 0 for n in d.get("shape", [-1]))}


@dataclass(frozen=True)
class Wanted:
    """What a /v2 (or gRPC) request asks of its answer: the adapter's context, kept to render it."""

    outputs: list[tuple[str, bool, int]]  # each output asked for: its name, binary, classes (0: raw rows)
    id: str | None = None  # the request's own id, echoed in the answer


def items_of(task: Task, tensors: dict[str, Tensor], max_items: int, wanted: Wanted) -> Work[Wanted]:
    """The request's items: BYTES elements to preprocess, or the model's own tensors, ready made."""
    encoded = BYTES_INPUT[task.input_kind]
    ready = fixed_inputs(task)
    unknown = set(tensors) - {encoded, *ready}
    if unknown:
        raise BadInput(f"unknown input {sorted(unknown)[0]!r}; {task.spec.name} takes {encoded} "
                       f"{'or ' + ', '.join(ready) if ready else ''}".strip(), code="bad_tensor")
    if encoded in tensors:
        if len(tensors) > 1:
            raise BadInput(f"send {encoded} or the ready tensors, not both", code="bad_tensor")
        return Work(encoded_items(task, tensors[encoded], max_items), wanted, raw=True)
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
    return Work(items, wanted, ready=True, raw=True)


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
    if task.input_kind == "file":
        kind = content_type(task, tensor.content_type or task.content_types[0])
        return [Upload(e, kind) for e in elements]
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


def classify(rows: list[np.ndarray], k: int, labels) -> list[bytes]:
    """Triton's classification extension: the k best of each row as "score:index[:label]"."""
    out = []
    for row in (r.reshape(-1) for r in rows):
        for i in np.argsort(-row, kind="stable")[:k]:
            out.append((f"{row[i]:f}:{i}" + (f":{labels[i]}" if labels else "")).encode())
    return out


def structured(value: Any) -> bool:
    """Whether an output row is JSON (maps, strings, lists of them), not numbers."""
    if isinstance(value, (dict, str)):
        return True
    return isinstance(value, list) and any(isinstance(each, (dict, str, list)) for each in value)


def outputs_of(task: Task, wanted: list[tuple[str, bool, int]], replies: list[Reply]
                   ) -> tuple[list[dict], list[bytes]]:
    """The requested outputs, each the replies' rows stacked to [n, ...] (rows of different shapes
    padded, the output's parameters say so: tensors.stack_rows), or each row classified on its own values."""
    outputs: list[dict] = []
    chunks: list[bytes] = []
    for output, binary, classes in wanted:
        values = [(r.outputs or {})[output] for r in replies]
        if any(structured(value) for value in values):  # a chain's lines, boxes with their texts: JSON each
            outputs.append(output_entry(output, [orjson.dumps(value) for value in values], [len(values)], binary,
                                        chunks, {"content_type": "application/json"}))
            continue
        rows = [np.asarray(value, dtype=np.float32) for value in values]
        if classes:
            k = min(classes, min(row.size for row in rows))
            outputs.append(output_entry(output, classify(rows, k, task.class_labels()), [len(rows), k],
                                        binary, chunks))
        else:
            value, parameters = stack_rows(output, rows)
            outputs.append(output_entry(output, value, list(value.shape), binary, chunks, parameters))
    return outputs, chunks


class V2:
    """POST /v2/models/<name>[/versions/<v>]/infer: tensors in, the model's own output rows out."""

    def __init__(self, max_items: int):
        self.max_items = max_items

    def parse(self, task: Task, request: Request) -> Work[Wanted]:
        header, binary = split_body(request.get_data(), request.headers.get("Inference-Header-Content-Length"))
        given_id = header.get("id")
        wanted = Wanted(requested_outputs(task, header), given_id if isinstance(given_id, str) else None)
        work = items_of(task, read_inputs(header, binary), self.max_items, wanted)
        parameters = header.get("parameters")
        if isinstance(parameters, dict) and "priority" in parameters:  # Triton's number, or a lane's name
            work.lane = priority.parse(parameters["priority"])
        return work

    def render(self, task: Task, work: Work[Wanted], answered: Answered) -> tuple[bytes, list[tuple[str, str]]]:
        outputs, chunks = outputs_of(task, work.kept.outputs, answered.replies)
        head: dict[str, Any] = {"model_name": task.spec.name, "model_version": str(task.spec.version)}
        if work.kept.id is not None:
            head["id"] = work.kept.id
        if answered.cache:  # whether the result cache answered it, as X-Cache says (queueing/cache_plan.py)
            head["parameters"] = {"cache": x_cache(answered.cache).lower()}
        body, headers = response_body(head, outputs, chunks)
        return body, list(headers.items())

    def render_error(self, error: Exception, request: Request) -> Rendered:
        """{"error": "<message>"}, the protocol's shape, with the status and headers /v1 would give."""
        if not errors.expected(error):
            log.exception("infer failed", exc_info=error)
        status, body, headers = errors.render(error, request)
        return status, orjson.dumps({"error": body["error"]["message"]}), headers
