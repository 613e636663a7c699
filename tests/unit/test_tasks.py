"""The built-in tasks: preprocessing on the web side, checks, buckets and collation on the worker side."""

import io
import itertools
import random

import numpy as np
import pytest

from funnel.common import tasks
from funnel.common.errors import BadInput
from funnel.common.store import load_spec
from funnel.common.tasks.buckets import group_by_width
from funnel.common.tasks.image_classification import ImageClassification
from funnel.common.tasks.text_embedding import TextEmbedding
from tests.support import jpeg_bytes


@pytest.fixture(scope="module")
def image_spec(model_store):
    return load_spec(model_store, "image-classifier")


@pytest.fixture(scope="module")
def text_spec(model_store):
    return load_spec(model_store, "text-embedding")


@pytest.fixture(scope="module")
def image(image_spec):
    return tasks.load(image_spec, {"max_pixels": 4_000_000})


@pytest.fixture(scope="module")
def text(text_spec):
    return tasks.load(text_spec, {"max_chars": 200})


def test_model_json_names_the_registered_tasks(image, text):
    assert type(image) is ImageClassification and image.input_kind == "image"
    assert type(text) is TextEmbedding and text.input_kind == "text"


def test_limits_default_then_model_json_then_given(text_spec):
    assert tasks.load(text_spec).limits == {"max_chars": 20_000}
    assert tasks.load(text_spec, {"max_chars": 5, "max_pixels": 9}).limits == {"max_chars": 5}


def test_unknown_limit_in_model_json_is_refused(text_spec):
    spec = type(text_spec)(name=text_spec.name, task=text_spec.task, path=text_spec.path,
                           batch_size=1, config={**text_spec.config, "limits": {"max_pixels": 3}})
    with pytest.raises(ValueError, match="max_pixels"):
        tasks.load(spec)


@pytest.mark.parametrize("name, message", [
    ("no_such_task", "unknown task"),
    ("funnel.common.store:ModelSpec", "not a subclass"),
    ("no.such.module:Task", "cannot be imported"),
])
def test_bad_task_names(name, message):
    with pytest.raises(ValueError, match=message):
        tasks.task_class(name)


def test_task_by_import_path():
    assert tasks.task_class("funnel.common.tasks.text_embedding:TextEmbedding") is TextEmbedding


# -- image -------------------------------------------------------------------


def test_image_preprocess_resizes_and_crops_to_uint8(cat_jpeg, image):
    pixels = image.preprocess(cat_jpeg)["pixels"]
    assert pixels.dtype == np.uint8 and pixels.shape == (224, 224, 3)


def test_image_preprocess_handles_grey_and_png(image):
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (300, 200), 128).save(out, format="PNG")
    assert image.preprocess(out.getvalue())["pixels"].shape == (224, 224, 3)


@pytest.mark.parametrize("data, code", [
    (b"definitely not an image", "not_an_image"),
])
def test_not_an_image(data, code, image):
    with pytest.raises(BadInput) as err:
        image.preprocess(data)
    assert err.value.code == code


def test_truncated_image(cat_jpeg, image):
    with pytest.raises(BadInput) as err:
        image.preprocess(cat_jpeg[: len(cat_jpeg) // 2])
    assert err.value.code == "corrupt_image"


def test_decompression_bomb(image):
    big = jpeg_bytes(np.zeros((2100, 2100, 3), np.uint8))  # 4.4 Mpx > 4 Mpx limit
    with pytest.raises(BadInput) as err:
        image.preprocess(big)
    assert err.value.code == "image_too_large"


def test_image_check_and_collate(image):
    good = {"pixels": np.zeros((224, 224, 3), np.uint8)}
    image.check(good)
    with pytest.raises(BadInput):
        image.check({"pixels": np.zeros((224, 224), np.uint8)})
    with pytest.raises(BadInput):
        image.check({"pixels": np.zeros((224, 224, 3), np.float32)})
    assert image.collate([good, good])["pixels"].shape == (2, 224, 224, 3)


def test_top_k_postprocess(image):
    probabilities = np.zeros(1000, np.float32)
    probabilities[[285, 281, 7]] = [0.6, 0.3, 0.1]
    predictions = image.postprocess({"probabilities": probabilities})["predictions"]
    assert [p["index"] for p in predictions[:3]] == [285, 281, 7]
    assert predictions[0]["label"] == "Egyptian cat" and len(predictions) == 5


# -- text --------------------------------------------------------------------


def test_text_preprocess_gives_unpadded_int32_ids(text):
    ids = text.preprocess("A man is eating food.")["input_ids"]
    assert ids.dtype == np.int32
    assert ids.tolist() == [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]


def test_printable_ascii_takes_the_cheaper_tokenizer_and_gets_the_same_ids(text):
    assert text.ascii_tokenizer is not text.tokenizer
    rng = random.Random(7)
    printable = [chr(c) for c in range(32, 127)]
    samples = ["A man is eating food.", "HELLO, World!! (x=3; y='a')", "C++ / C# & Rust: 100% {ok} [sic] ~`^|\\"]
    samples += ["".join(rng.choice(printable) for _ in range(rng.randint(1, 150))) for _ in range(3000)]
    for sample in samples:
        assert text.ascii_tokenizer.encode(sample).ids == text.tokenizer.encode(sample).ids, sample
        assert text.preprocess(sample)["input_ids"].tolist() == text.tokenizer.encode(sample).ids


@pytest.mark.parametrize("item", ["Café au lait", "naïve résumé", "北京 is big", "tab\there", "line\nbreak",
                                  "bell\x07 and del\x7f", "nul\x00byte"])
def test_other_text_takes_the_full_normalizer(item, text):
    """Accents, CJK and control characters are the full normalizer's: its ids, not lowercasing's."""
    assert text.preprocess(item)["input_ids"].tolist() == text.tokenizer.encode(item).ids
    assert text.tokenizer.encode("Café").ids != text.ascii_tokenizer.encode("Café").ids  # the case it guards


@pytest.mark.parametrize("item, code", [("", "empty_input"), ("   ", "empty_input"),
                                        ("x" * 201, "text_too_long")])
def test_text_preprocess_rejects(item, code, text):
    with pytest.raises(BadInput) as err:
        text.preprocess(item)
    assert err.value.code == code


def test_text_over_max_tokens(text_spec):
    long = " ".join(["word"] * 300)
    with pytest.raises(BadInput, match="at most 256"):
        tasks.load(text_spec, {"max_chars": 10_000}).preprocess(long)


def test_collate_pads_to_the_longest_in_the_batch(text):
    a = {"input_ids": np.array([101, 7, 102], np.int32)}
    b = {"input_ids": np.array([101, 102], np.int32)}
    feeds = text.collate([a, b])
    assert feeds["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


def test_text_check(text):
    text.check({"input_ids": np.array([101, 102], np.int32)})
    for bad in [np.array([], np.int32), np.array([[1]], np.int32), np.array([1], np.int64),
                np.array([10**6], np.int32), np.array([-1], np.int32)]:
        with pytest.raises(BadInput):
            text.check({"input_ids": bad})


def ids(n: int) -> dict:
    return {"input_ids": np.arange(1, n + 1, dtype=np.int32)}


def test_buckets_split_one_long_text_from_many_short(text):
    items = [ids(8)] * 15 + [ids(256)] + [ids(8)] * 16
    groups = text.buckets(items)
    assert sorted(map(len, groups)) == [1, 31] and [15] in groups
    assert sorted(i for g in groups for i in g) == list(range(32))  # every item exactly once


def test_buckets_keep_uniform_or_small_batches_whole(text):
    groups = text.buckets([ids(10), ids(12), ids(11)] * 8)
    assert len(groups) == 1 and sorted(groups[0]) == list(range(24))
    assert len(text.buckets([ids(5), ids(40)])) == 1  # saves 35 padded tokens, less than a run costs


def test_buckets_split_a_spread_batch_into_a_few_runs(text):
    """Lengths spread from 8 to 256: the halving rule kept them whole (2x the tokens of one by one)."""
    lengths = list(range(8, 257, 8))  # 32 texts
    groups = text.buckets([ids(n) for n in lengths])
    assert 4 <= len(groups) <= 10 and sorted(i for g in groups for i in g) == list(range(32))
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    assert padded < 0.6 * 32 * 256
    assert [max(lengths[i] for i in g) for g in groups] == sorted(max(lengths[i] for i in g) for g in groups)


def test_run_cost_tokens_comes_from_model_json(text_spec):
    spec = type(text_spec)(name=text_spec.name, task=text_spec.task, path=text_spec.path, batch_size=32,
                           config={**text_spec.config, "run_cost_tokens": 0})
    items = [ids(10), ids(12), ids(11), ids(10)]
    assert sorted(map(sorted, tasks.load(spec).buckets(items))) == [[0, 3], [1], [2]]  # every length apart


@pytest.mark.parametrize("seed", range(40))
def test_group_by_width_finds_the_cheapest_runs(seed):
    rng = random.Random(seed)
    widths = [rng.randint(1, 40) for _ in range(rng.randint(1, 9))]
    run_cost = rng.choice([0, 5, 20, 100])
    runs = group_by_width(widths, run_cost)
    assert sorted(i for r in runs for i in r) == list(range(len(widths)))

    def cost(runs):
        return sum(len(r) * max(widths[i] for i in r) + run_cost for r in runs)

    order = sorted(range(len(widths)), key=widths.__getitem__)
    cheapest = min(cost([order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)))])
                   for k in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), k))
    assert cost(runs) == cheapest


def test_group_by_width_keeps_equal_widths_together():
    assert group_by_width([3, 1, 3, 2], 0) == [[1], [3], [0, 2]]  # narrowest first, each width apart
    assert group_by_width([7] * 5, 0) == [[0, 1, 2, 3, 4]]
    assert group_by_width([], 10) == []
