"""Tensors as the Open Inference Protocol carries them over HTTP: JSON, or JSON plus binary data.

A request body is a JSON header, optionally followed by raw tensor bytes
(the binary tensor data extension: the header's length is in the
`Inference-Header-Content-Length` HTTP header, and each input that sends
binary data says how many bytes in `parameters.binary_data_size`). BYTES
elements are each a 4-byte little-endian length and that many bytes.

Every size is checked against the bytes actually received before anything is
allocated: a declared shape cannot make the server reserve memory the request
did not bring.
"""

from __future__ import annotations

import logging
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from funnel.common.errors import BadInput, InferenceFailed
from funnel.web.jsonio import OPTIONS

# Protocol datatype -> numpy dtype (little-endian, as the protocol sends them). BYTES is apart.
DATATYPES: dict[str, np.dtype] = {name: np.dtype(kind).newbyteorder("<") for name, kind in {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.items()}
NAMES_OF = {dtype.name: name for name, dtype in DATATYPES.items()}
MAX_DIMS = 8

log = logging.getLogger("funnel.web")


@dataclass(kw_only=True)
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    value: np.ndarray | list[bytes]  # BYTES: the elements, in row-major order
    content_type: str = ""  # the input's "content_type" parameter: what a FILE input's elements are


def bad(message: str) -> BadInput:
    return BadInput(message, code="bad_tensor")


def split_body(body: bytes, header_length: str | None) -> tuple[dict, memoryview]:
    """The JSON header and the binary data after it."""
    if header_length is None:
        size = len(body)
    else:
        try:
            size = int(header_length)
        except ValueError:
            raise bad(f"Inference-Header-Content-Length {header_length!r} is not a number") from None
        if not 0 < size <= len(body):
            raise bad(f"Inference-Header-Content-Length {size} does not fit a body of {len(body)} bytes")
    try:
        header = orjson.loads(body[:size])
    except orjson.JSONDecodeError as exc:
        raise bad(f"the request header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list) or not header["inputs"]:
        raise bad('the request must be a JSON object with a non-empty "inputs" list')
    return header, memoryview(body)[size:]


def read_inputs(header: dict, binary: memoryview) -> dict[str, Tensor]:
    """Every input of the request, its data taken from JSON or from the binary part, in order."""
    tensors: dict[str, Tensor] = {}
    offset = 0
    for spec in header["inputs"]:
        tensor, used = read_input(spec, binary[offset:])
        if tensor.name in tensors:
            raise bad(f"input {tensor.name!r} is given twice")
        tensors[tensor.name] = tensor
        offset += used
    if offset != len(binary):
        raise bad(f"{len(binary) - offset} bytes of binary data follow the last input's")
    return tensors


def read_input(spec: Any, binary: memoryview) -> tuple[Tensor, int]:
    """One input, and how many bytes of the binary part it used."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise bad('each input is an object with a "name"')
    name = spec["name"]
    count = element_count(name, spec.get("datatype"), spec.get("shape"))
    datatype: str = spec["datatype"]  # both known sound now
    shape: list[int] = spec["shape"]
    parameters = spec.get("parameters") or {}
    size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > len(binary):
            raise bad(f"input {name!r}: binary_data_size {size!r} runs past the end of the body")
        value = from_binary(name, datatype, count, binary[:size])
        return Tensor(name=name, datatype=datatype, shape=shape, value=value,
                      content_type=content_type_of(name, parameters)), size
    if "data" not in spec:
        raise bad(f"input {name!r} has neither data nor binary_data_size")
    return Tensor(name=name, datatype=datatype, shape=shape, value=from_json(name, datatype, count, spec["data"]),
                  content_type=content_type_of(name, parameters)), 0


def content_type_of(name: str, parameters: Any) -> str:
    given = parameters.get("content_type", "") if isinstance(parameters, dict) else ""
    if not isinstance(given, str):
        raise bad(f"input {name!r}: content_type must be a string")
    return given


def element_count(name: str, datatype: Any, shape: Any) -> int:
    """How many elements a declared input holds, once its datatype and shape are known to be sound
    (HTTP's JSON header and gRPC's message alike)."""
    if datatype != "BYTES" and datatype not in DATATYPES:
        raise bad(f"input {name!r}: unknown datatype {datatype!r}")
    if (not isinstance(shape, list) or not 0 < len(shape) <= MAX_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise bad(f"input {name!r}: shape must be a list of 1 to {MAX_DIMS} non-negative integers")
    return math.prod(shape)


def from_binary(name: str, datatype: str, count: int, raw: memoryview) -> np.ndarray | list[bytes]:
    if datatype == "BYTES":
        elements = split_bytes(name, raw)
        if len(elements) != count:
            raise bad(f"input {name!r}: {len(elements)} BYTES elements for a shape of {count}")
        return elements
    dtype = DATATYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise bad(f"input {name!r}: {len(raw)} bytes for a {datatype} shape of {count} elements "
                  f"({count * dtype.itemsize} bytes)")
    return np.frombuffer(raw, dtype=dtype)


def split_bytes(name: str, raw: memoryview) -> list[bytes]:
    """BYTES elements: each a 4-byte little-endian length and that many bytes."""
    elements, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise bad(f"input {name!r}: a BYTES length is cut off")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise bad(f"input {name!r}: a BYTES element of {length} bytes runs past the end of its data")
        elements.append(bytes(raw[offset:offset + length]))
        offset += length
    return elements


def from_json(name: str, datatype: str, count: int, data: Any) -> np.ndarray | list[bytes]:
    flat = flatten(data)
    if len(flat) != count:
        raise bad(f"input {name!r}: {len(flat)} data elements for a shape of {count}")
    if datatype == "BYTES":
        if not all(isinstance(x, str) for x in flat):
            raise bad(f"input {name!r}: BYTES data in JSON must be strings")
        return [x.encode() for x in flat]
    if not all(isinstance(x, (int, float)) for x in flat):  # bool is an int: fine for BOOL
        raise bad(f"input {name!r}: {datatype} data must be numbers")
    try:
        return np.asarray(flat, dtype=DATATYPES[datatype])
    except (OverflowError, ValueError) as exc:
        raise bad(f"input {name!r}: {exc}") from None


def flatten(data: Any) -> list:
    """Row-major elements of a flat or nested JSON list."""
    if not isinstance(data, list):
        raise bad("tensor data must be a JSON list")
    out: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) > MAX_DIMS:
                    raise bad("tensor data is nested too deeply")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


# -- answers -----------------------------------------------------------------


def join_bytes(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def stack_rows(name: str, rows: list[np.ndarray]) -> tuple[np.ndarray, dict[str, Any]]:
    """Items' rows of one output as one [n, ...] tensor, and the output's parameters.

    Rows of one shape are stacked as they are (no parameters). Rows whose
    shapes differ (a variable-length output whose items ran in different
    batches, or in different runs of one) are padded with zeros at the end of
    each axis to the largest size on that axis, and the parameters say so:
    {"padded": true, "row_shapes": [each row's own shape]}. Rows of different
    ranks cannot share a tensor: the model's fault, a 500 that says so.
    """
    shapes = [row.shape for row in rows]
    first = shapes[0]
    if all(shape == first for shape in shapes):
        return np.stack(rows), {}
    other = next((shape for shape in shapes if len(shape) != len(first)), None)
    if other is not None:
        message = (f"output {name!r}: the model gave rows of different ranks, {list(first)} and {list(other)}, "
                   f"which no tensor can hold; send these items in separate requests")
        log.warning("answering 500: %s", message)
        raise InferenceFailed(message)
    padded = np.zeros((len(rows), *np.max(shapes, axis=0)), dtype=rows[0].dtype)
    for out, row in zip(padded, rows):
        out[tuple(slice(0, size) for size in row.shape)] = row
    return padded, {"padded": True, "row_shapes": [list(shape) for shape in shapes]}


def output_entry(name: str, value: np.ndarray | list[bytes], shape: list[int], binary: bool,
                 chunks: list[bytes], parameters: dict[str, Any] | None = None) -> dict:
    """One output of an answer (with its parameters, if any); its bytes go to chunks when sent as binary data."""
    datatype = "BYTES" if isinstance(value, list) else NAMES_OF[value.dtype.name]
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if parameters:
        entry["parameters"] = dict(parameters)
    if binary:
        raw = join_bytes(value) if isinstance(value, list) else \
            np.ascontiguousarray(value, dtype=DATATYPES[datatype]).tobytes()
        entry["parameters"] = {**entry.get("parameters", {}), "binary_data_size": len(raw)}
        chunks.append(raw)
    elif isinstance(value, list):
        entry["data"] = [e.decode("utf-8", errors="replace") for e in value]
    else:  # written by orjson straight from the array (OPTIONS), as /v1's answers are
        entry["data"] = np.ascontiguousarray(value, dtype=DATATYPES[datatype]).ravel()
    return entry


def response_body(header: dict, outputs: list[dict], chunks: list[bytes]) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers: JSON alone, or the JSON header followed by binary data."""
    head = orjson.dumps({**header, "outputs": outputs}, option=OPTIONS)
    if not chunks:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(chunks), {"Content-Type": "application/octet-stream",
                                    "Inference-Header-Content-Length": str(len(head))}
