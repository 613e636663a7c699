"""Both exported backends agree with the eager PyTorch model on real inputs; the int8 and fp16
variants stay close to fp32."""

import numpy as np
import pytest
import torch

from funnel.common.store import load_spec
from funnel.scripts import prepare_model
from funnel.worker import backend as backends
from funnel.worker.cores import CoreLock
from tests.support import SENTENCES, cosines, image_feeds, text_feeds


@pytest.fixture(scope="module")
def image_batch(model_store, cat_jpeg, coffee_jpeg):
    spec = load_spec(model_store, "image-classifier")
    return spec, image_feeds(spec, [cat_jpeg, coffee_jpeg])


@pytest.fixture(scope="module")
def text_batch(model_store):
    spec = load_spec(model_store, "text-embedding")
    return spec, text_feeds(spec)


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_image_backends_match_eager(backend, image_batch):
    spec, feeds = image_batch
    with torch.inference_mode():
        eager = prepare_model.load_image_classifier()(torch.from_numpy(feeds["pixels"].copy())).numpy()
    got = backends.load(spec, backend, "cpu").outputs(feeds)["probabilities"]
    np.testing.assert_allclose(got, eager, atol=1e-4)
    assert got[0].argmax() in (281, 282, 285)  # tabby, tiger cat, Egyptian cat
    assert got[1].argmax() == 967  # espresso


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_text_backends_match_eager(backend, text_batch):
    spec, feeds = text_batch
    with torch.inference_mode():
        eager = prepare_model.load_text_embedder()(
            torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])).numpy()
    got = backends.load(spec, backend, "cpu").outputs(feeds)["embedding"]
    np.testing.assert_allclose(got, eager, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert got[0] @ got[1] == pytest.approx(0.755, abs=0.01)
    assert got[0] @ got[2] == pytest.approx(-0.105, abs=0.01)


def test_padding_does_not_change_an_embedding(text_batch):
    spec, feeds = text_batch
    model = backends.load(spec, "onnx", "cpu")
    batched = model.outputs(feeds)["embedding"]
    for row, n in enumerate(feeds["attention_mask"].sum(axis=1)):
        alone = model.outputs({"input_ids": feeds["input_ids"][row:row + 1, :n],
                           "attention_mask": feeds["attention_mask"][row:row + 1, :n]})["embedding"]
        np.testing.assert_allclose(batched[row], alone[0], atol=1e-5)


@pytest.mark.parametrize("spinning", [True, False])
def test_onnx_threads_never_spin_between_runs(text_batch, spinning):
    """Between batches the worker replies and takes: threads spinning then burn the web tier's cores."""
    spec, feeds = text_batch
    options = backends.load(spec, "onnx", "cpu", spinning=spinning).session.get_session_options()
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")


def test_fused_transformer_graph(text_batch):
    spec, _ = text_batch
    assert spec.config["onnx_fusions"]["Attention"] == 6  # one per layer


def test_int8_text_model_stays_close_to_fp32(model_store, tmp_path):
    import random
    import shutil

    from funnel.common.store import load_spec

    shutil.copytree(model_store / "text-embedding", tmp_path / "text-embedding")
    prepare_model.prepare_quantized(tmp_path, "text-embedding")
    fp32_spec, int8_spec = load_spec(tmp_path, "text-embedding"), load_spec(tmp_path, "text-embedding-int8")
    random.seed(7)
    words = ("the a man woman dog cat eats runs quickly market fell rose quantum computer sky blue red "
             "music plays loud in on under over house car tree river mountain city").split()
    sentences = SENTENCES + [" ".join(random.choice(words) for _ in range(random.randint(2, 40)))
                             for _ in range(60)]
    feeds = text_feeds(fp32_spec, sentences)
    fp32 = backends.load(fp32_spec, "onnx", "cpu").outputs(feeds)["embedding"]
    int8 = backends.load(int8_spec, "onnx", "cpu").outputs(feeds)["embedding"]
    cosine = (fp32 * int8).sum(axis=1)
    assert cosine.min() >= 0.99, cosine.min()
    with pytest.raises(ValueError, match="no TorchScript"):
        backends.load(int8_spec, "torch", "cpu")


def test_io_binding_gives_the_plain_run_outputs(image_batch, text_batch):
    for spec, feeds in (image_batch, text_batch):
        model = backends.OnnxBackend(spec, "cpu", 0, io_binding=True)  # by default only on CUDA
        bound = model.outputs(feeds)
        model.io_binding = False
        plain = model.outputs(feeds)
        assert bound.keys() == plain.keys() == set(spec.config["outputs"])
        for name in plain:
            np.testing.assert_array_equal(bound[name], plain[name])
    assert not backends.OnnxBackend(image_batch[0], "cpu", 0).io_binding


class Recorder:
    """An ONNX Runtime session that notes each run's batch size."""

    def __init__(self, session):
        self.session, self.sizes = session, []

    def run(self, names, feeds):
        self.sizes.append(len(next(iter(feeds.values()))))
        return self.session.run(names, feeds)


def test_a_lone_item_runs_on_all_the_cores_while_no_other_worker_runs(text_batch, tmp_path):
    """With a core lock (worker/cores.py) a worker on a share of the cores runs a lone item on a
    session over all of them, unless another worker holds the lock; a batch of several on its
    share; the answers are the same either way."""
    spec, feeds = text_batch
    lock = str(tmp_path / "cores.lock")
    model = backends.load(spec, "onnx", "cpu", threads=1, spinning=False, core_lock=lock)
    assert model.whole.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "1"
    share, whole = model.session, model.whole
    model.session, model.whole = Recorder(share), Recorder(whole)
    one = {name: array[:1] for name, array in feeds.items()}
    alone = model.outputs(one)["embedding"]
    batched = model.outputs(feeds)["embedding"]
    with CoreLock(lock).run(lone=False):  # another worker runs a batch
        beside = model.outputs(one)["embedding"]
    assert model.whole.sizes == [1] and model.session.sizes == [len(batched), 1]
    np.testing.assert_allclose(alone[0], batched[0], atol=1e-5)
    np.testing.assert_allclose(beside, alone, atol=1e-6)
    assert backends.load(spec, "onnx", "cpu", core_lock=lock).cores is None  # on all the cores already


def test_a_core_lock_that_cannot_be_opened_leaves_the_worker_on_its_share(text_batch, tmp_path, caplog):
    spec, feeds = text_batch
    model = backends.load(spec, "onnx", "cpu", threads=1, core_lock=str(tmp_path / "gone" / "cores.lock"))
    assert model.cores is None and "core lock" in caplog.text
    assert model.outputs(feeds)["embedding"].shape == (len(feeds["input_ids"]), 384)


class SizeRecorder:
    """A backend that notes the batch sizes it is given, then runs them."""

    def __init__(self, inner):
        self.inner, self.sizes = inner, []
        self.description = ""

    def run(self, feeds):
        self.sizes.append(len(next(iter(feeds.values()))))
        return self.inner.run(feeds)


def test_power_of_two_batches_answer_each_item_as_run_alone(text_batch):
    """The CUDA wrapper pads 3 to 4 and 5 to 8 rows; each answer is the item's own."""
    spec, _ = text_batch
    texts = SENTENCES + ["A woman is playing the violin.", "Two dogs run across a field of snow."]
    inner = backends.OnnxBackend(spec, "cpu", 0)
    recorder = SizeRecorder(inner)
    model = backends.PowerOfTwoBatches(recorder)
    for n in (1, 3, 5, 6):
        got = np.stack([row["embedding"] for row in model.run(text_feeds(spec, texts[:n]))])
        alone = np.concatenate([inner.outputs(text_feeds(spec, [t]))["embedding"] for t in texts[:n]])
        assert got.shape == (n, 384)
        np.testing.assert_allclose(got, alone, atol=1e-5)
    assert recorder.sizes == [1, 4, 8, 8]


def test_fp16_folders(fp16_store):
    import onnx

    for base, side_file in (("image-classifier", "labels.txt"), ("text-embedding", "tokenizer.json")):
        fp32, fp16 = load_spec(fp16_store, base), load_spec(fp16_store, f"{base}-fp16")
        assert fp16.config == {**fp32.config, "name": fp16.name, "precision": "fp16",
                               "description": fp32.config["description"] + ", fp16 (for CUDA)"}
        assert (fp16.path / side_file).read_bytes() == (fp32.path / side_file).read_bytes()
        graph, fp32_graph = (onnx.load(str(spec.file("onnx"))).graph for spec in (fp16, fp32))
        inputs = [[(i.name, i.type.tensor_type.elem_type) for i in g.input] for g in (graph, fp32_graph)]
        assert inputs[0] == inputs[1]  # integer ids or uint8 pixels, as before
        assert [o.type.tensor_type.elem_type for o in graph.output] == [onnx.TensorProto.FLOAT]
        floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
        assert {t.data_type for t in graph.initializer} & floats == {onnx.TensorProto.FLOAT16}
        # Traced on the CPU, yet no device is fixed in the graph: it follows the inputs to CUDA.
        module = torch.jit.load(str(fp16.file("torchscript")))
        nodes = module.graph.findAllNodes("prim::Constant")
        assert not [n for n in nodes if isinstance(n.output().type(), torch._C.DeviceObjType)]


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_fp16_text_model_stays_close_to_fp32(backend, fp16_store, text_batch, caplog):
    spec, feeds = text_batch
    fp32 = backends.load(spec, backend, "cpu").outputs(feeds)["embedding"]
    fp16 = backends.load(load_spec(fp16_store, "text-embedding-fp16"), backend, "cpu").outputs(feeds)["embedding"]
    assert fp16.dtype == np.float32
    assert cosines(fp16, fp32).min() >= 0.99
    assert "fp16 model, meant for CUDA" in caplog.text


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_fp16_image_model_stays_close_to_fp32(backend, fp16_store, image_batch):
    spec, feeds = image_batch
    fp32 = backends.load(spec, backend, "cpu").outputs(feeds)["probabilities"]
    fp16 = backends.load(load_spec(fp16_store, "image-classifier-fp16"), backend, "cpu").outputs(
        feeds)["probabilities"]
    np.testing.assert_array_equal(fp16.argmax(axis=1), fp32.argmax(axis=1))
    np.testing.assert_allclose(fp16, fp32, atol=0.02)
