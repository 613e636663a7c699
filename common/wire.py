"""The msgpack wire format of jobs and replies (never pickle).

A tensor is a map {dtype, shape, data} with data the raw C-order bytes, read
back with numpy.frombuffer without a copy. Decoding is strict: an unknown
version, a missing or mistyped field or an oversized message raises
WireError, never anything else.

A field added later is optional on decoding, with the value the messages before
it meant (`raw`: False; `version`: 1, the one version a model had; `trace` and
`request_id`: none; `priority`: the normal lane), so the protocol version stays 1 and old and new processes
read each other's messages.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_TENSOR_DIMS = 8
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


def unpack_tensor(obj: Any) -> np.ndarray:
    if not isinstance(obj, dict) or set(obj) != _TENSOR_KEYS:
        raise WireError("a tensor is a map of exactly dtype, shape and data")
    dtype, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if dtype not in DTYPES:
        raise WireError(f"unknown dtype {dtype!r}")
    if (not isinstance(shape, list) or len(shape) > MAX_TENSOR_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise WireError(f"bad tensor shape {shape!r}")
    if not isinstance(data, bytes):
        raise WireError("tensor data must be bytes")
    itemsize = np.dtype(dtype).itemsize
    if math.prod(shape) * itemsize != len(data):
        raise WireError(f"tensor of shape {shape} and dtype {dtype} needs "
                        f"{math.prod(shape) * itemsize} bytes, got {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


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


def _field(obj: dict, name: str, kinds: type | tuple, optional: bool = False) -> Any:
    if name not in obj:
        if optional:
            return None
        raise WireError(f"missing field {name!r}")
    value = obj[name]
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise WireError(f"field {name!r} has the wrong type")
    if not isinstance(value, kinds):
        raise WireError(f"field {name!r} has the wrong type")
    return value


# -- jobs ------------------------------------------------------------------

@dataclass
class Job:
    id: str
    model: str
    inputs: dict[str, np.ndarray]
    reply_to: str
    deadline: int  # epoch ms
    enqueued: int = field(default_factory=now_ms)  # epoch ms
    attempt: int = 0
    raw: bool = False  # answer the model's own output rows, not the task's postprocessed result
    version: int = 1  # the model version that must run it (its queue's version)
    trace: str = ""  # the W3C traceparent of the request that sent it ("": not traced)
    request_id: str = ""  # the request's X-Request-ID, for the worker's log lines about it
    priority: str = ""  # its lane, "high" or "low" ("": normal, common/priority.py): recovery requeues it there


def encode_job(job: Job) -> bytes:
    return _pack({
        "v": VERSION, "id": job.id, "model": job.model,
        "inputs": {name: pack_tensor(t) for name, t in job.inputs.items()},
        "reply_to": job.reply_to, "deadline": job.deadline,
        "enqueued": job.enqueued, "attempt": job.attempt, "raw": job.raw, "version": job.version,
        # Only when set: an untraced job is no bigger than before.
        **({"trace": job.trace} if job.trace else {}), **({"request_id": job.request_id} if job.request_id else {}),
        **({"priority": job.priority} if job.priority else {}),
    })


def _version(obj: dict) -> int:
    """A message's model version: optional (1 for messages from before versions), a positive int."""
    version = _field(obj, "version", int, optional=True)
    if version is None:
        return 1
    if version < 1:
        raise WireError(f"model version must be a positive integer, got {version}")
    return version


def decode_job(data: Any) -> Job:
    obj = _unpack(data)
    inputs = _field(obj, "inputs", dict)
    if not inputs or not all(isinstance(k, str) for k in inputs):
        raise WireError("inputs must be a non-empty map of named tensors")
    return Job(
        id=_field(obj, "id", str), model=_field(obj, "model", str),
        inputs={name: unpack_tensor(t) for name, t in inputs.items()},
        reply_to=_field(obj, "reply_to", str), deadline=_field(obj, "deadline", int),
        enqueued=_field(obj, "enqueued", int), attempt=_field(obj, "attempt", int),
        raw=bool(_field(obj, "raw", bool, optional=True)),  # optional: jobs of version-1 webs lack it
        version=_version(obj),  # optional: jobs from before model versions lack it
        trace=_field(obj, "trace", str, optional=True) or "",  # optional: absent when not traced
        request_id=_field(obj, "request_id", str, optional=True) or "",
        priority=_lane(obj),
    )


def _lane(obj: dict) -> str:
    """A job's lane other than normal: optional ("" for normal, and for jobs from before lanes)."""
    lane = _field(obj, "priority", str, optional=True) or ""
    if lane not in ("", "high", "low"):
        raise WireError(f"unknown priority {lane[:20]!r}")
    return lane


def peek_job(data: Any) -> dict:
    """Best-effort id and reply_to of a job that failed to decode, for an error reply."""
    try:
        obj = msgpack.unpackb(data, raw=False, max_bin_len=MAX_MESSAGE_BYTES,
                              max_str_len=1024 * 1024, max_array_len=1024,
                              max_map_len=64, max_ext_len=0)
    except Exception:
        return {}
    if not isinstance(obj, dict):
        return {}
    return {k: obj[k] for k in ("id", "reply_to", "model") if isinstance(obj.get(k), str)}


# -- replies ---------------------------------------------------------------

@dataclass
class Reply:
    id: str
    ok: bool
    outputs: dict[str, Any] | None = None  # tensors or plain msgpack values
    error: dict[str, str] | None = None  # {code, message}
    worker: str = ""
    batch_size: int = 0
    queue_ms: float = 0.0
    infer_ms: float = 0.0
    version: int = 1  # the model version that computed it (or refused it)

    @classmethod
    def failure(cls, job_id: str, code: str, message: str, **meta: Any) -> Reply:
        return cls(id=job_id, ok=False, error={"code": code, "message": message}, **meta)


def encode_reply(reply: Reply) -> bytes:
    obj: dict[str, Any] = {
        "v": VERSION, "id": reply.id, "ok": reply.ok, "worker": reply.worker,
        "batch_size": reply.batch_size, "queue_ms": float(reply.queue_ms),
        "infer_ms": float(reply.infer_ms), "version": reply.version,
    }
    if reply.ok:
        obj["outputs"] = {name: pack_tensor(v) if isinstance(v, np.ndarray) else v
                          for name, v in (reply.outputs or {}).items()}
    else:
        error = reply.error or {}
        obj["error"] = {"code": str(error.get("code", "")), "message": str(error.get("message", ""))}
    return _pack(obj)


def decode_reply(data: Any) -> Reply:
    obj = _unpack(data)
    ok = _field(obj, "ok", bool)
    outputs = error = None
    if ok:
        raw = _field(obj, "outputs", dict)
        outputs = {name: unpack_tensor(v) if _is_tensor(v) else v for name, v in raw.items()}
    else:
        error = _field(obj, "error", dict)
        if not isinstance(error.get("code"), str) or not isinstance(error.get("message"), str):
            raise WireError("error must be a map of code and message strings")
    return Reply(
        id=_field(obj, "id", str), ok=ok, outputs=outputs, error=error,
        worker=_field(obj, "worker", str), batch_size=_field(obj, "batch_size", int),
        queue_ms=_field(obj, "queue_ms", (int, float)), infer_ms=_field(obj, "infer_ms", (int, float)),
        version=_version(obj),  # optional: replies from before model versions lack it
    )
