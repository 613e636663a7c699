"""The fp16 (and fp32) models on a CUDA GPU against the same models on the CPU.

Skipped without a GPU. The store is FUNNEL_MODEL_STORE (default model_store),
and each test skips when its model folder or file is not there: a GPU host
may be given only the fp16 folders (prepare_model.py --half).
"""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from funnel.common.store import load_spec
from funnel.worker import backend as backends
from tests.support import cosines, image_feeds, text_feeds

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")]

STORE = Path(os.environ.get("FUNNEL_MODEL_STORE", "model_store"))
CUDA = "cuda:0"
TEXT, IMAGE = "text-embedding", "image-classifier"


def spec_with(name: str, export: str):
    """The model's spec, or a skip when the store lacks the folder or this export."""
    try:
        spec = load_spec(STORE, name)
    except FileNotFoundError:
        pytest.skip(f"no {name} in {STORE}")
    if export not in spec.config or not spec.file(export).is_file():
        pytest.skip(f"{name} has no {export} file in {STORE}")
    return spec


@pytest.fixture(scope="module")
def images(cat_jpeg, coffee_jpeg) -> list[bytes]:
    return [cat_jpeg, coffee_jpeg]


def predict(spec, model, images: list[bytes]) -> np.ndarray:
    """The model's one output on the test sentences or photos."""
    feeds = text_feeds(spec) if spec.task == "text_embedding" else image_feeds(spec, images)
    return np.stack([row[spec.config["outputs"][0]] for row in model.run(feeds)])


def assert_close(spec, on_gpu: np.ndarray, on_cpu: np.ndarray, min_cosine: float) -> None:
    assert on_gpu.dtype == np.float32 and on_gpu.shape == on_cpu.shape
    if spec.task == "text_embedding":
        assert cosines(on_gpu, on_cpu).min() >= min_cosine
    else:
        np.testing.assert_array_equal(on_gpu.argmax(axis=1), on_cpu.argmax(axis=1))
        np.testing.assert_allclose(on_gpu, on_cpu, atol=0.02)


@pytest.mark.parametrize("name, min_cosine", [(f"{TEXT}-fp16", 0.999), (f"{IMAGE}-fp16", None),
                                              (TEXT, 0.99), (IMAGE, None)])
def test_torchscript_on_cuda_matches_cpu(name, min_cosine, images):
    spec = spec_with(name, "torchscript")
    on_gpu = predict(spec, backends.load(spec, "torch", CUDA), images)
    assert_close(spec, on_gpu, predict(spec, backends.load(spec, "torch", "cpu"), images), min_cosine)


@pytest.mark.parametrize("name", [f"{TEXT}-fp16", f"{IMAGE}-fp16", TEXT, IMAGE])
def test_onnx_on_cuda_through_io_binding(name, images):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu)")
    spec = spec_with(name, "onnx")
    model = backends.load(spec, "onnx", CUDA)
    session = model.inner  # inside PowerOfTwoBatches, as on every CUDA device
    assert session.io_binding and session.session.get_providers()[0] == "CUDAExecutionProvider"
    bound = predict(spec, model, images)
    session.io_binding = False
    np.testing.assert_allclose(bound, predict(spec, model, images), atol=1e-3)
    # Against the same graph on the CPU (ONNX Runtime runs fp16 graphs there too, slowly).
    on_cpu = predict(spec, backends.load(spec, "onnx", "cpu"), images)
    assert_close(spec, bound, on_cpu, 0.999 if name.endswith("-fp16") else 0.99)
