"""The graphs of the outside detector and audio model (tests/third_party/toydetect, toyaudio), built
with onnx.helper, and `funnel add` for each as a user would run it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tests.toy_model import funnel, outside_env

SIZE, STRIDE = 64, 8  # the detector's square and its grid's cell: 8 x 8 anchors
DETECT_LABELS = ["red", "green", "blue"]


def _save(graph, path: Path) -> None:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_detector(path: Path) -> None:
    """A YOLOv8-shaped head: images uint8 [n, 64, 64, 3] -> output0 [n, 4 + 3, 64]. Each 8 x 8 cell's
    mean colour (r, g, b) places a box near the cell's centre (cx + 4(r - .5), cy + 4(g - .5)), sized
    4 + 40b by 4 + 40r, and scores each class sigmoid(12(colour - .5))."""
    from onnx import TensorProto, helper, numpy_helper

    cells = SIZE // STRIDE
    centres = (np.arange(cells, dtype=np.float32) + 0.5) * STRIDE
    grid_x = np.broadcast_to(centres[None, :], (cells, cells)).reshape(1, 1, cells, cells).copy()
    grid_y = np.broadcast_to(centres[:, None], (cells, cells)).reshape(1, 1, cells, cells).copy()
    constants = {"grid_x": grid_x, "grid_y": grid_y, "k255": np.array(255, np.float32),
                 "half": np.array(0.5, np.float32), "four": np.array(4, np.float32),
                 "forty": np.array(40, np.float32), "twelve": np.array(12, np.float32),
                 "shape": np.array([0, 4 + len(DETECT_LABELS), cells * cells], np.int64)}
    node = helper.make_node
    nodes = [
        node("Cast", ["images"], ["as_float"], to=TensorProto.FLOAT),
        node("Div", ["as_float", "k255"], ["unit"]),
        node("Transpose", ["unit"], ["nchw"], perm=[0, 3, 1, 2]),
        node("AveragePool", ["nchw"], ["mean"], kernel_shape=[STRIDE, STRIDE], strides=[STRIDE, STRIDE]),
        node("Sub", ["mean", "half"], ["centred"]),
        node("Split", ["centred"], ["r", "g", "b"], axis=1),
        node("Mul", ["r", "four"], ["dx"]), node("Add", ["grid_x", "dx"], ["cx"]),
        node("Mul", ["g", "four"], ["dy"]), node("Add", ["grid_y", "dy"], ["cy"]),
        node("Add", ["b", "half"], ["b01"]), node("Mul", ["b01", "forty"], ["w40"]),
        node("Add", ["w40", "four"], ["w"]),
        node("Add", ["r", "half"], ["r01"]), node("Mul", ["r01", "forty"], ["h40"]),
        node("Add", ["h40", "four"], ["h"]),
        node("Mul", ["centred", "twelve"], ["logits"]), node("Sigmoid", ["logits"], ["scores"]),
        node("Concat", ["cx", "cy", "w", "h", "scores"], ["head"], axis=1),
        node("Reshape", ["head", "shape"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes, "toy-detect",
        [helper.make_tensor_value_info("images", TensorProto.UINT8, ["batch", SIZE, SIZE, 3])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 4 + len(DETECT_LABELS), cells * cells])],
        [numpy_helper.from_array(value, name) for name, value in constants.items()])
    _save(graph, path)


def write_levels(path: Path) -> None:
    """waveform float32 [n, samples] (a multiple of 160) -> levels [n, samples / 160]: each 10 ms
    frame's mean power in dB, 10 log10(mean(x²) + 1e-10)."""
    from onnx import TensorProto, helper, numpy_helper

    constants = {"frames": np.array([0, -1, 160], np.int64), "floor": np.array(1e-10, np.float32),
                 "db": np.array(10 / math.log(10), np.float32)}
    node = helper.make_node
    nodes = [
        node("Reshape", ["waveform", "frames"], ["framed"]),
        node("Mul", ["framed", "framed"], ["power"]),
        node("ReduceMean", ["power"], ["mean"], axes=[2], keepdims=0),
        node("Add", ["mean", "floor"], ["floored"]),
        node("Log", ["floored"], ["ln"]),
        node("Mul", ["ln", "db"], ["levels"]),
    ]
    graph = helper.make_graph(
        nodes, "toy-levels",
        [helper.make_tensor_value_info("waveform", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("levels", TensorProto.FLOAT, ["batch", "frames"])],
        [numpy_helper.from_array(value, name) for name, value in constants.items()])
    _save(graph, path)


def add_detector(store: Path, work: Path, name: str) -> None:
    """funnel add NAME --task toydetect.tasks:Detector --onnx detect.onnx --file labels=classes.txt --set size=64"""
    write_detector(work / "detect.onnx")
    (work / "classes.txt").write_text("\n".join(DETECT_LABELS) + "\n")
    done = funnel("add", name, "--store", str(store), "--task", "toydetect.tasks:Detector",
                  "--onnx", str(work / "detect.onnx"), "--file", f"labels={work / 'classes.txt'}",
                  "--set", f"size={SIZE}", "--batch-size", "8", env=outside_env())
    assert done.returncode == 0, done.stderr


def add_levels(store: Path, work: Path, name: str) -> None:
    """funnel add NAME --task toyaudio.tasks:ClipLevels --onnx levels.onnx"""
    write_levels(work / "levels.onnx")
    done = funnel("add", name, "--store", str(store), "--task", "toyaudio.tasks:ClipLevels",
                  "--onnx", str(work / "levels.onnx"), "--batch-size", "8", env=outside_env())
    assert done.returncode == 0, done.stderr
