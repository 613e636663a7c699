"""A ModelInferRequest's tensors, and a ModelInferResponse's, as /v2's tensors.py reads and writes them.

An input's elements come either in `raw_input_contents` (one entry per input,
in order: the bytes as /v2's binary data carries them) or in the typed
repeated field of its datatype (`contents.fp32_contents`, ...). Each size is
checked against what the message brought before anything is converted or
allocated: the shape's element count against the raw bytes or the repeated
field's length, and a batch (an input's first dimension) against
FUNNEL_MAX_ITEMS, so that neither a lying shape nor a huge repeated field
costs more than reading the message did. The answer is always raw, as
Triton's is: `raw_output_contents`, one entry per output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from funnel.web.grpc import open_inference_pb2 as pb
from funnel.web.protocols.tensors import DATATYPES, Tensor, bad, element_count, from_binary

# Each datatype's repeated field in InferTensorContents, and that field's own numpy type.
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}
FIELD_DTYPES = {"bool_contents": np.bool_, "int_contents": np.int32, "int64_contents": np.int64,
                "uint_contents": np.uint32, "uint64_contents": np.uint64, "fp32_contents": np.float32,
                "fp64_contents": np.float64}


def read_inputs(request: pb.ModelInferRequest, max_items: int) -> dict[str, Tensor]:
    """Every input of the request by name, its data from raw_input_contents or from its contents."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise bad(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs; send one per input")
    tensors: dict[str, Tensor] = {}
    for i, spec in enumerate(request.inputs):
        if spec.name in tensors:
            raise bad(f"input {spec.name!r} is given twice")
        shape = list(spec.shape)
        count = element_count(spec.name, spec.datatype, shape)
        if shape[0] > max_items or (spec.datatype == "BYTES" and count > max_items):
            raise bad(f"input {spec.name!r}: shape {shape} holds more than the {max_items} items a request "
                      "may have")
        if raw:
            if spec.HasField("contents"):
                raise bad(f"input {spec.name!r}: send raw_input_contents or contents, not both")
            value = from_binary(spec.name, spec.datatype, count, memoryview(raw[i]))
        else:
            value = from_contents(spec, count)
        given = spec.parameters["content_type"].string_param if "content_type" in spec.parameters else ""
        tensors[spec.name] = Tensor(name=spec.name, datatype=spec.datatype, shape=shape, value=value,
                                    content_type=given)
    return tensors


def from_contents(spec: pb.ModelInferRequest.InferInputTensor, count: int) -> np.ndarray | list[bytes]:
    """An input's elements from its typed repeated field, whose length must be the shape's count."""
    field = CONTENTS.get(spec.datatype)
    if field is None:
        raise bad(f"input {spec.name!r}: {spec.datatype} travels in raw_input_contents only")
    values = getattr(spec.contents, field)
    if len(values) != count:
        raise bad(f"input {spec.name!r}: {len(values)} {field} for a {spec.datatype} shape of {count} "
                  "elements")
    if spec.datatype == "BYTES":
        return list(values)
    wide: np.ndarray = np.asarray(values, dtype=FIELD_DTYPES[field])
    value = wide.astype(DATATYPES[spec.datatype])
    if value.dtype.itemsize < wide.dtype.itemsize and not np.array_equal(value, wide):
        raise bad(f"input {spec.name!r}: values out of range for {spec.datatype}")
    return value


def parameter(value: pb.InferParameter) -> Any:
    """An InferParameter's value, whichever kind it holds (None for none)."""
    kind = value.WhichOneof("parameter_choice")
    return getattr(value, kind) if kind else None


def outputs_header(request: pb.ModelInferRequest) -> dict[str, Any]:
    """The requested outputs as /v2's JSON header names them (protocols/v2.py: requested_outputs),
    every one as binary data: the answer is raw."""
    header: dict[str, Any] = {"parameters": {"binary_data_output": True}}
    if request.outputs:
        header["outputs"] = [{"name": output.name,
                              "parameters": {key: parameter(value) for key, value in output.parameters.items()}}
                             for output in request.outputs]
    return header


def infer_response(model: str, version: int, request_id: str, outputs: list[dict], chunks: list[bytes]
                   ) -> pb.ModelInferResponse:
    """The answer: /v2's output entries (protocols/v2.py: outputs_of, as binary data) and their bytes."""
    response = pb.ModelInferResponse(model_name=model, model_version=str(version), id=request_id)
    for entry in outputs:
        output = response.outputs.add(name=entry["name"], datatype=entry["datatype"], shape=entry["shape"])
        for key, value in entry.get("parameters", {}).items():
            if key != "binary_data_size":  # HTTP's framing; gRPC's is raw_output_contents
                set_parameter(output.parameters[key], value)
    response.raw_output_contents.extend(chunks)
    return response


def set_parameter(target: pb.InferParameter, value: Any) -> None:
    """A parameter's value in the field of its kind; a list (row_shapes) as a JSON string."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = value if isinstance(value, str) else orjson.dumps(value).decode()
