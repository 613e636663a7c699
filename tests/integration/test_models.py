"""Both exported backends agree with the eager PyTorch model on real inputs."""

import numpy as np
import pytest
import torch

from common.store import load_spec
from common.tasks import Limits, image_classification, text_embedding
from scripts import prepare_model
from worker import backend as backends

LIMITS = Limits()
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "A man is riding a horse on a sunny day in the hills."]


@pytest.fixture(scope="module")
def image_batch(model_store, cat_jpeg, coffee_jpeg):
    spec = load_spec(model_store, "image-classifier")
    items = [image_classification.preprocess(b, spec, LIMITS) for b in (cat_jpeg, coffee_jpeg)]
    return spec, image_classification.collate(items, spec)


@pytest.fixture(scope="module")
def text_batch(model_store):
    spec = load_spec(model_store, "text-embedding")
    items = [text_embedding.preprocess(s, spec, LIMITS) for s in SENTENCES]
    return spec, text_embedding.collate(items, spec)


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_image_backends_match_eager(backend, image_batch):
    spec, feeds = image_batch
    with torch.inference_mode():
        eager = prepare_model.load_image_classifier()(torch.from_numpy(feeds["pixels"].copy())).numpy()
    got = backends.load(spec, backend, "cpu").run(feeds)["probabilities"]
    np.testing.assert_allclose(got, eager, atol=1e-4)
    assert got[0].argmax() in (281, 282, 285)  # tabby, tiger cat, Egyptian cat
    assert got[1].argmax() == 967  # espresso


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_text_backends_match_eager(backend, text_batch):
    spec, feeds = text_batch
    with torch.inference_mode():
        eager = prepare_model.load_text_embedder()(
            torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])).numpy()
    got = backends.load(spec, backend, "cpu").run(feeds)["embedding"]
    np.testing.assert_allclose(got, eager, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert got[0] @ got[1] == pytest.approx(0.755, abs=0.01)
    assert got[0] @ got[2] == pytest.approx(-0.105, abs=0.01)


def test_padding_does_not_change_an_embedding(text_batch):
    spec, feeds = text_batch
    model = backends.load(spec, "onnx", "cpu")
    batched = model.run(feeds)["embedding"]
    for row, n in enumerate(feeds["attention_mask"].sum(axis=1)):
        alone = model.run({"input_ids": feeds["input_ids"][row:row + 1, :n],
                           "attention_mask": feeds["attention_mask"][row:row + 1, :n]})["embedding"]
        np.testing.assert_allclose(batched[row], alone[0], atol=1e-5)


def test_fused_transformer_graph(text_batch):
    spec, _ = text_batch
    assert spec.config["onnx_fusions"]["Attention"] == 6  # one per layer


def test_int8_text_model_stays_close_to_fp32(model_store, tmp_path):
    import random
    import shutil

    from common.store import load_spec

    shutil.copytree(model_store / "text-embedding", tmp_path / "text-embedding")
    prepare_model.prepare_quantized(tmp_path, "text-embedding")
    fp32_spec, int8_spec = load_spec(tmp_path, "text-embedding"), load_spec(tmp_path, "text-embedding-int8")
    random.seed(7)
    words = ("the a man woman dog cat eats runs quickly market fell rose quantum computer sky blue red "
             "music plays loud in on under over house car tree river mountain city").split()
    sentences = SENTENCES + [" ".join(random.choice(words) for _ in range(random.randint(2, 40)))
                             for _ in range(60)]
    feeds = text_embedding.collate([text_embedding.preprocess(s, fp32_spec, LIMITS) for s in sentences],
                                   fp32_spec)
    fp32 = backends.load(fp32_spec, "onnx", "cpu").run(feeds)["embedding"]
    int8 = backends.load(int8_spec, "onnx", "cpu").run(feeds)["embedding"]
    cosine = (fp32 * int8).sum(axis=1)
    assert cosine.min() >= 0.99, cosine.min()
    with pytest.raises(ValueError, match="no TorchScript"):
        backends.load(int8_spec, "torch", "cpu")
