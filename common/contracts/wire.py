"""The msgpack wire format of jobs and replies (never pickle).

A tensor is a map {dtype, shape, data} with data the raw C-order bytes, read
back with numpy.frombuffer without a copy. Decoding is strict: an unknown
version, a missing or mistyped field or an oversized message raises
WireError, never anything else.

A field added later is optional on decoding, with the value the messages before
it meant (`raw`: False; `version`: 1, the one version a model had; `trace`,
`request_id` and `cache`: none; `priority`: the normal lane), so the protocol version stays 1
and old and new processes read each other's messages.

A job carries one request's items. One item travels as `inputs`, as it always
did; several as `items`, a list of such maps, with their count `n` written
right after `v`, where the take script reads it without decoding the message
(`item_count`, common/link/lua/take.lua). A reply answers its job's items likewise:
`outputs`, or `items` in the job's order; an error answers the job whole.

An item may carry a context: what the task's preprocess learned of it that its
result needs (an original size, a true length), a map of msgpack-safe values of
at most MAX_CONTEXT_BYTES, never fed to the model. A job whose items have any
carries `contexts`, one per item (nil for an item without), before its tensors;
a job without is as it was before contexts (JOB_FORMAT 3).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

VERSION = 1
# The newest job format a worker reads (it reads every older one), which it publishes in the
# registry (`wire`, common/contracts/registry.py): 1, one item a job (`inputs`); 2, a job of several items
# (`items`, `n`); 3, items with a context (`contexts`). The web tier makes a model version's jobs in
# the oldest format its live workers read, so a web tier and the workers of the release before or
# after it serve side by side.
JOB_FORMAT = 3
CONTEXT_FORMAT = 3  # the first job format whose readers hand an item's context to the task
MAX_CONTEXT_BYTES = 64 * 1024  # one item's context, packed
MAX_CONTEXT_DEPTH = 8
MAX_JOB_ITEMS = 0xFFFF  # the count is a msgpack fixint, uint8 or uint16: what take.lua reads
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_TENSOR_DIMS = 8
HANDLE_BYTES = 256  # a long message's first bytes, which name it in flight (`handle`)
DTYPES = frozenset({"bool", "uint8", "int8", "int16", "uint16", "int32", "uint32",
                    "int64", "uint64", "float16", "float32", "float64"})
_TENSOR_KEYS = frozenset({"dtype", "shape", "data"})


class WireError(ValueError):
    """A message that is not a valid job or reply."""


def now_ms() -> int:
    return int(time.time() * 1000)


# -- tensors ---------------------------------------------------------------

# The wire's dtypes in native byte order, by dtype: numpy computes dtype.name in Python, which
# cost a third of packing a text request's token ids.
_NATIVE = {np.dtype(name): name for name in DTYPES}


def pack_tensor(array: np.ndarray) -> dict:
    array = np.asarray(array)
    name = _NATIVE.get(array.dtype)
    if name is None:  # not a wire dtype, or one in the other byte order
        name = array.dtype.name
        if name not in DTYPES:
            raise WireError(f"dtype {name} cannot go on the wire")
        array = array.astype(array.dtype.newbyteorder("="))
    return {"dtype": name, "shape": list(array.shape), "data": np.ascontiguousarray(array).tobytes()}


_DTYPE = {name: np.dtype(name) for name in DTYPES}  # parsed once: a job may hold many tensors


def unpack_tensor(obj: Any) -> np.ndarray:
    # Checks in plain loops, not any() or math.prod: a job unpacks a tensor per input of each item.
    try:  # three fields, each found: exactly these three
        if type(obj) is not dict or len(obj) != 3:
            raise KeyError
        dtype, shape, data = obj["dtype"], obj["shape"], obj["data"]
    except KeyError:
        raise WireError("a tensor is a map of exactly dtype, shape and data") from None
    numpy_dtype = _DTYPE.get(dtype) if type(dtype) is str else None
    if numpy_dtype is None:
        raise WireError(f"unknown dtype {dtype!r}")
    if type(shape) is not list or len(shape) > MAX_TENSOR_DIMS:
        raise WireError(f"bad tensor shape {shape!r}")
    size = numpy_dtype.itemsize
    for d in shape:
        if type(d) is not int or d < 0:
            raise WireError(f"bad tensor shape {shape!r}")
        size *= d
    if type(data) is not bytes:
        raise WireError("tensor data must be bytes")
    if size != len(data):
        raise WireError(f"tensor of shape {shape} and dtype {dtype} needs {size} bytes, got {len(data)}")
    return np.frombuffer(data, dtype=numpy_dtype).reshape(shape)


def _is_tensor(obj: Any) -> bool:
    return isinstance(obj, dict) and set(obj) == _TENSOR_KEYS


# -- msgpack framing -------------------------------------------------------

def _pack(obj: dict) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: Any) -> dict:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("a message must be bytes")
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        obj = msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True,
            max_bin_len=MAX_MESSAGE_BYTES, max_str_len=1024 * 1024,
            max_array_len=1024 * 1024, max_map_len=4096, max_ext_len=0)
    except Exception as exc:  # msgpack raises a zoo of types on garbage
        raise WireError(f"not msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError("a message must be a map")
    if obj.get("v") != VERSION:
        raise WireError(f"unsupported protocol version {obj.get('v')!r}")
    return obj


_MISSING = object()


def _field(obj: dict, name: str, kinds: type | tuple, optional: bool = False) -> Any:
    value = obj.get(name, _MISSING)
    # The exact type first: what msgpack gives, and never a bool where an int is asked (every
    # message's every field passes here).
    if type(value) is kinds or (type(kinds) is tuple and type(value) in kinds):
        return value
    if value is _MISSING:
        if optional:
            return None
        raise WireError(f"missing field {name!r}")
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise WireError(f"field {name!r} has the wrong type")
    if not isinstance(value, kinds):
        raise WireError(f"field {name!r} has the wrong type")
    return value


# -- jobs ------------------------------------------------------------------

@dataclass(kw_only=True)
class Job:
    id: str
    model: str
    items: list[dict[str, np.ndarray]]  # one request's items, each its named tensors, in the request's order
    reply_to: str
    deadline: int  # epoch ms
    enqueued: int = field(default_factory=now_ms)  # epoch ms
    attempt: int = 0
    raw: bool = False  # answer the model's own output rows, not the task's postprocessed result
    version: int = 1  # the model version that must run it (its queue's version)
    trace: str = ""  # the W3C traceparent of the request that sent it ("": not traced)
    request_id: str = ""  # the request's X-Request-ID, for the worker's log lines about it
    priority: str = ""  # its lane, "high" or "low" ("": normal, contracts/priority.py): recovery requeues it there
    cache: str = ""  # its one item's result-cache ident, "<scope>:<digest>" (common/result_cache.py; "": none)
    contexts: list[dict[str, Any] | None] | None = None  # each item's context (None: the job's items have none)


# -- item contexts ---------------------------------------------------------

_SCALARS = (type(None), bool, int, float, str)


def check_context(context: Any) -> None:
    """WireError unless context is a map of msgpack-safe values (None, bool, int, float, str, lists,
    maps with str keys, nested at most MAX_CONTEXT_DEPTH deep) of at most MAX_CONTEXT_BYTES packed."""
    if type(context) is not dict:
        raise WireError(f"a context is a map, not {type(context).__name__}")
    _check_value(context, 0)
    try:
        size = len(_pack(context))
    except (OverflowError, ValueError) as exc:  # an int past 64 bits
        raise WireError(f"a context value cannot go on the wire: {exc}") from None
    if size > MAX_CONTEXT_BYTES:
        raise WireError(f"a context of {size} bytes packed exceeds {MAX_CONTEXT_BYTES}")


def _check_value(value: Any, depth: int) -> None:
    kind = type(value)
    if kind in _SCALARS:
        return
    if depth >= MAX_CONTEXT_DEPTH:
        raise WireError(f"a context nests deeper than {MAX_CONTEXT_DEPTH}")
    if kind is list:
        for element in value:
            _check_value(element, depth + 1)
    elif kind is dict:
        for key, element in value.items():
            if type(key) is not str:
                raise WireError(f"a context's keys are strings, not {type(key).__name__}")
            _check_value(element, depth + 1)
    else:  # numpy scalars and arrays included: float(x), x.tolist()
        raise WireError(f"a context holds None, bool, int, float, str, lists and maps, not {kind.__qualname__}")


def _contexts(obj: dict, count: int) -> list[dict[str, Any] | None] | None:
    """A job's item contexts: optional (None for jobs without, and from before contexts)."""
    contexts = _field(obj, "contexts", list, optional=True)
    if contexts is None:
        return None
    if len(contexts) != count:
        raise WireError(f"a job of {count} items has {len(contexts)} contexts")
    for context in contexts:
        if context is not None:
            check_context(context)
    return contexts


def encode_job(job: Job) -> bytes:
    if not 0 < len(job.items) <= MAX_JOB_ITEMS:
        raise WireError(f"a job holds 1 to {MAX_JOB_ITEMS} items, not {len(job.items)}")
    if job.contexts is not None and len(job.contexts) != len(job.items):
        raise WireError(f"a job of {len(job.items)} items has {len(job.contexts)} contexts")
    items = [{name: pack_tensor(t) for name, t in item.items()} for item in job.items]
    return _pack({
        "v": VERSION,
        **({"n": len(items)} if len(items) > 1 else {}),  # second, where take.lua reads it
        "id": job.id, "model": job.model,
        "reply_to": job.reply_to, "deadline": job.deadline,
        "enqueued": job.enqueued, "attempt": job.attempt, "raw": job.raw, "version": job.version,
        # Only when set: an untraced job is no bigger than before.
        **({"trace": job.trace} if job.trace else {}), **({"request_id": job.request_id} if job.request_id else {}),
        **({"priority": job.priority} if job.priority else {}), **({"cache": job.cache} if job.cache else {}),
        # Only when an item has one (checked by the web tier as it prepares it, and here as it is read):
        # a job without is what a worker of JOB_FORMAT 2 reads.
        **({"contexts": job.contexts} if job.contexts is not None else {}),
        # Last, so that peek_job reads the fields before them without unpacking the tensors. One
        # item as jobs always were (any worker reads it); several as a list.
        **({"inputs": items[0]} if len(items) == 1 else {"items": items}),
    })


def _version(obj: dict) -> int:
    """A message's model version: optional (1 for messages from before versions), a positive int."""
    version = _field(obj, "version", int, optional=True)
    if version is None:
        return 1
    if version < 1:
        raise WireError(f"model version must be a positive integer, got {version}")
    return version


def _item(inputs: Any) -> dict[str, np.ndarray]:
    if type(inputs) is not dict or not inputs:
        raise WireError("inputs must be a non-empty map of named tensors")
    item = {}
    for name, tensor in inputs.items():
        if type(name) is not str:
            raise WireError("inputs must be a non-empty map of named tensors")
        item[name] = unpack_tensor(tensor)
    return item


def _items(obj: dict) -> list[dict[str, np.ndarray]]:
    """A job's items: its one `inputs`, or its `items`, as many as its `n` says."""
    if ("inputs" in obj) == ("items" in obj):
        raise WireError("a job has either inputs or items")
    if "inputs" in obj:
        return [_item(_field(obj, "inputs", dict))]
    items, count = _field(obj, "items", list), _field(obj, "n", int)
    if not 1 < count <= MAX_JOB_ITEMS or count != len(items):
        raise WireError(f"a job of {len(items)} items says it has {count}")
    return [_item(inputs) for inputs in items]


def item_count(data: bytes) -> int:
    """A job message's items, read from its head as common/link/lua/take.lua reads it: at least 1 (1 when
    it names no `n`), whatever the bytes, a short or hand-pushed message's included."""
    head = bytes(data[:11]).ljust(11, b"\0")  # past the end reads as zeros, as the script reads it
    at = 1 if 0x80 <= head[0] <= 0x8F else 3 if head[0] == 0xDE else -1  # fixmap, map 16
    if at < 0 or head[at:at + 5] != b"\xa1v\x01\xa1n":
        return 1
    kind = head[at + 5]
    if kind == 0xCC:
        return max(1, head[at + 6])
    if kind == 0xCD:
        return max(1, int.from_bytes(head[at + 6:at + 8], "big"))
    return max(1, kind) if kind <= 0x7F else 1


def handle(data: bytes, job_id: str) -> bytes:
    """What names a taken message in its worker's in-flight list (common/link/lua/in_flight.lua, with
    its length): its first HANDLE_BYTES where it is longer and its job's id lies among them (`v`,
    `n` and `id` come first), else the whole message. An image's pixels then make one trip back from
    Redis to the worker, not a second one to Redis with its answer."""
    if len(data) > HANDLE_BYTES and job_id and data.find(job_id.encode(), 0, HANDLE_BYTES) > 0:
        return data[:HANDLE_BYTES]
    return data


def decode_job(data: Any) -> Job:
    obj = _unpack(data)
    items = _items(obj)
    return Job(
        id=_field(obj, "id", str), model=_field(obj, "model", str), items=items,
        reply_to=_field(obj, "reply_to", str), deadline=_field(obj, "deadline", int),
        enqueued=_field(obj, "enqueued", int), attempt=_field(obj, "attempt", int),
        raw=bool(_field(obj, "raw", bool, optional=True)),  # optional: jobs of version-1 webs lack it
        version=_version(obj),  # optional: jobs from before model versions lack it
        trace=_field(obj, "trace", str, optional=True) or "",  # optional: absent when not traced
        request_id=_field(obj, "request_id", str, optional=True) or "",
        priority=_lane(obj),
        cache=_cache_ident(obj),
        contexts=_contexts(obj, len(items)),  # optional: absent when no item has one
    )


_CACHE_IDENT = re.compile(r"[A-Za-z0-9._-]{1,64}:[0-9a-f]{32}")


def _cache_ident(obj: dict) -> str:
    """A job's result-cache ident: optional ("" for none, and for jobs from before the cache); it
    names keys the worker writes, so it is held to their alphabet."""
    ident = _field(obj, "cache", str, optional=True) or ""
    if ident and not _CACHE_IDENT.fullmatch(ident):
        raise WireError(f"bad cache ident {ident[:80]!r}")
    return ident


def _lane(obj: dict) -> str:
    """A job's lane other than normal: optional ("" for normal, and for jobs from before lanes)."""
    lane = _field(obj, "priority", str, optional=True) or ""
    if lane not in ("", "high", "low"):
        raise WireError(f"unknown priority {lane[:20]!r}")
    return lane


_PEEKED = ("id", "reply_to", "model")


def peek_job(data: Any) -> dict:
    """Best-effort id, reply_to and model of a job, without decoding it: for an error reply to one
    that failed to decode, and to find the job a bulk item belongs to (common/bulk/jobs.py). Reads the
    map's fields in turn and stops once it has them, before the tensors (encode_job writes them last)."""
    found: dict[str, str] = {}
    try:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_MESSAGE_BYTES, max_bin_len=MAX_MESSAGE_BYTES,
                                    max_str_len=1024 * 1024, max_array_len=1024, max_map_len=64, max_ext_len=0)
        unpacker.feed(data)
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key in _PEEKED:
                value = unpacker.unpack()
                if isinstance(value, str):
                    found[key] = value
                if len(found) == len(_PEEKED):
                    break
            else:
                unpacker.skip()
    except Exception:  # msgpack raises a zoo of types on garbage: what was read before it stands
        pass
    return found


# -- replies ---------------------------------------------------------------

@dataclass(kw_only=True)
class Reply:
    id: str
    ok: bool
    outputs: dict[str, Any] | None = None  # tensors or plain msgpack values: a one-item job's
    items: list[dict[str, Any]] | None = None  # the outputs of each item of a job of several, in its order
    error: dict[str, Any] | None = None  # {code, message}, and status (400-599) when it names its own
    worker: str = ""
    batch_size: int = 0
    queue_ms: float = 0.0
    infer_ms: float = 0.0
    version: int = 1  # the model version that computed it (or refused it)
    item: int = -1  # a failure's item, its index in the job (-1: the job's as a whole)

    @classmethod
    def failure(cls, job_id: str, code: str, message: str, **meta: Any) -> Reply:
        return cls(id=job_id, ok=False, error={"code": code, "message": message}, **meta)

    def each(self) -> list[Reply]:
        """One reply per item of the job it answers (a failure answers the job whole: itself)."""
        if self.items is None:
            return [self]
        shared = {**self.__dict__, "items": None}
        each = []
        for outputs in self.items:  # copies of its fields, not __init__ again: a job may hold many
            reply = object.__new__(Reply)
            reply.__dict__.update(shared, outputs=outputs)
            each.append(reply)
        return each


def encode_reply(reply: Reply) -> bytes:
    obj: dict[str, Any] = {
        "v": VERSION, "id": reply.id, "ok": reply.ok, "worker": reply.worker,
        "batch_size": reply.batch_size, "queue_ms": float(reply.queue_ms),
        "infer_ms": float(reply.infer_ms), "version": reply.version,
    }
    if reply.ok and reply.items is not None:
        obj["items"] = [_pack_outputs(outputs) for outputs in reply.items]
    elif reply.ok:
        obj["outputs"] = _pack_outputs(reply.outputs or {})
    else:
        error = reply.error or {}
        obj["error"] = {"code": str(error.get("code", "")), "message": str(error.get("message", ""))}
        if error.get("status"):
            obj["error"]["status"] = int(error["status"])
        if reply.item >= 0:
            obj["item"] = reply.item
    return _pack(obj)


def _pack_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    return {name: pack_tensor(v) if isinstance(v, np.ndarray) else v for name, v in outputs.items()}


def _unpack_outputs(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise WireError("outputs must be a map")
    return {name: unpack_tensor(v) if _is_tensor(v) else v for name, v in raw.items()}


def decode_reply(data: Any) -> Reply:
    obj = _unpack(data)
    ok = _field(obj, "ok", bool)
    outputs = items = error = None
    if ok and "items" in obj:
        items = [_unpack_outputs(raw) for raw in _field(obj, "items", list)]
    elif ok:
        outputs = _unpack_outputs(_field(obj, "outputs", dict))
    else:
        error = _field(obj, "error", dict)
        if not isinstance(error.get("code"), str) or not isinstance(error.get("message"), str):
            raise WireError("error must be a map of code and message strings")
        if "status" in error and not (type(error["status"]) is int and 400 <= error["status"] <= 599):
            raise WireError(f"an error's status must be an HTTP error status, got {error['status']!r}")
    return Reply(
        id=_field(obj, "id", str), ok=ok, outputs=outputs, items=items, error=error,
        worker=_field(obj, "worker", str), batch_size=_field(obj, "batch_size", int),
        queue_ms=_field(obj, "queue_ms", (int, float)), infer_ms=_field(obj, "infer_ms", (int, float)),
        version=_version(obj),  # optional: replies from before model versions lack it
        item=_item_index(obj),
    )


def _item_index(obj: dict) -> int:
    """A failure's item in its job: optional (-1, the job as a whole, for replies from before jobs of several)."""
    item = _field(obj, "item", int, optional=True)
    if item is None:
        return -1
    if item < 0:
        raise WireError(f"a failed item's index must be at least 0, got {item}")
    return item
