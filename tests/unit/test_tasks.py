"""Task modules: web-side parsing and preprocessing, worker-side checks and collation."""

import io

import numpy as np
import pytest
from flask import Flask, request

from common.errors import BadInput, UnsupportedMediaType
from common.store import load_spec
from common.tasks import Limits, image_classification as image, text_embedding as text
from tests.conftest import jpeg_bytes

LIMITS = Limits(max_items=4, max_text_chars=200, max_image_pixels=4_000_000)


@pytest.fixture(scope="module")
def image_spec(model_store):
    return load_spec(model_store, "image-classifier")


@pytest.fixture(scope="module")
def text_spec(model_store):
    return load_spec(model_store, "text-embedding")


def parse_with(task, **request_args):
    with Flask(__name__).test_request_context("/", method="POST", **request_args):
        return task.parse(request, LIMITS)


# -- image -------------------------------------------------------------------

def test_image_from_multipart_and_raw_body(cat_jpeg):
    items, single = parse_with(image, data={"file": (io.BytesIO(cat_jpeg), "cat.jpg")},
                               content_type="multipart/form-data")
    assert single and items == [cat_jpeg]
    items, _ = parse_with(image, data=cat_jpeg, content_type="image/jpeg")
    assert items == [cat_jpeg]


def test_image_wrong_content_type_is_415():
    with pytest.raises(UnsupportedMediaType):
        parse_with(image, data="{}", content_type="application/json")


def test_image_multipart_without_file_field():
    with pytest.raises(BadInput, match="'file'"):
        parse_with(image, data={"other": "x"}, content_type="multipart/form-data")


def test_image_preprocess_resizes_and_crops_to_uint8(cat_jpeg, image_spec):
    pixels = image.preprocess(cat_jpeg, image_spec, LIMITS)["pixels"]
    assert pixels.dtype == np.uint8 and pixels.shape == (224, 224, 3)


def test_image_preprocess_handles_grey_and_png(image_spec):
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (300, 200), 128).save(out, format="PNG")
    assert image.preprocess(out.getvalue(), image_spec, LIMITS)["pixels"].shape == (224, 224, 3)


@pytest.mark.parametrize("data, code", [
    (b"definitely not an image", "not_an_image"),
])
def test_not_an_image(data, code, image_spec):
    with pytest.raises(BadInput) as err:
        image.preprocess(data, image_spec, LIMITS)
    assert err.value.code == code


def test_truncated_image(cat_jpeg, image_spec):
    with pytest.raises(BadInput) as err:
        image.preprocess(cat_jpeg[: len(cat_jpeg) // 2], image_spec, LIMITS)
    assert err.value.code == "corrupt_image"


def test_decompression_bomb(image_spec):
    big = jpeg_bytes(np.zeros((2100, 2100, 3), np.uint8))  # 4.4 Mpx > 4 Mpx limit
    with pytest.raises(BadInput) as err:
        image.preprocess(big, image_spec, LIMITS)
    assert err.value.code == "image_too_large"


def test_image_check_and_collate(image_spec):
    good = {"pixels": np.zeros((224, 224, 3), np.uint8)}
    image.check(good, image_spec)
    with pytest.raises(BadInput):
        image.check({"pixels": np.zeros((224, 224), np.uint8)}, image_spec)
    with pytest.raises(BadInput):
        image.check({"pixels": np.zeros((224, 224, 3), np.float32)}, image_spec)
    assert image.collate([good, good], image_spec)["pixels"].shape == (2, 224, 224, 3)


def test_top_k_postprocess(image_spec):
    probabilities = np.zeros(1000, np.float32)
    probabilities[[285, 281, 7]] = [0.6, 0.3, 0.1]
    predictions = image.postprocess({"probabilities": probabilities}, image_spec)["predictions"]
    assert [p["index"] for p in predictions[:3]] == [285, 281, 7]
    assert predictions[0]["label"] == "Egyptian cat" and len(predictions) == 5


# -- text --------------------------------------------------------------------

def test_text_single_and_many():
    assert parse_with(text, json={"text": "hi"}) == (["hi"], True)
    assert parse_with(text, json={"texts": ["a", "b"]}) == (["a", "b"], False)


@pytest.mark.parametrize("body, code", [
    ({"texts": ["a"] * 5}, "too_many_items"),
    ({"texts": []}, "bad_json"),
    ({"texts": ["a", 3]}, "bad_json"),
    ({"text": "a", "texts": ["b"]}, "bad_json"),
    ({}, "bad_json"),
    ([1, 2], "bad_json"),
])
def test_text_bad_bodies(body, code):
    with pytest.raises(BadInput) as err:
        parse_with(text, json=body)
    assert err.value.code == code


def test_text_bad_json_and_content_type():
    with pytest.raises(BadInput):
        parse_with(text, data="{not json", content_type="application/json")
    with pytest.raises(UnsupportedMediaType):
        parse_with(text, data="hello", content_type="text/plain")


def test_text_preprocess_gives_unpadded_int32_ids(text_spec):
    ids = text.preprocess("A man is eating food.", text_spec, LIMITS)["input_ids"]
    assert ids.dtype == np.int32
    assert ids.tolist() == [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]


@pytest.mark.parametrize("item, code", [("", "empty_input"), ("   ", "empty_input"),
                                        ("x" * 201, "text_too_long")])
def test_text_preprocess_rejects(item, code, text_spec):
    with pytest.raises(BadInput) as err:
        text.preprocess(item, text_spec, LIMITS)
    assert err.value.code == code


def test_text_over_max_tokens(text_spec):
    long = " ".join(["word"] * 300)
    with pytest.raises(BadInput, match="at most 256"):
        text.preprocess(long, text_spec, Limits(max_text_chars=10_000))


def test_collate_pads_to_the_longest_in_the_batch(text_spec):
    a = {"input_ids": np.array([101, 7, 102], np.int32)}
    b = {"input_ids": np.array([101, 102], np.int32)}
    feeds = text.collate([a, b], text_spec)
    assert feeds["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


def test_text_check(text_spec):
    text.check({"input_ids": np.array([101, 102], np.int32)}, text_spec)
    for bad in [np.array([], np.int32), np.array([[1]], np.int32), np.array([1], np.int64),
                np.array([10**6], np.int32), np.array([-1], np.int32)]:
        with pytest.raises(BadInput):
            text.check({"input_ids": bad}, text_spec)


def ids(n: int) -> dict:
    return {"input_ids": np.arange(1, n + 1, dtype=np.int32)}


def test_buckets_split_one_long_text_from_many_short(text_spec):
    items = [ids(8)] * 15 + [ids(256)] + [ids(8)] * 16
    groups = text.buckets(items, text_spec)
    assert sorted(map(len, groups)) == [1, 31] and [15] in groups
    assert sorted(i for g in groups for i in g) == list(range(32))  # every item exactly once


def test_buckets_keep_uniform_or_small_batches_whole(text_spec):
    groups = text.buckets([ids(10), ids(12), ids(11)] * 8, text_spec)
    assert len(groups) == 1 and sorted(groups[0]) == list(range(24))
    assert len(text.buckets([ids(5), ids(40)], text_spec)) == 1  # saves < MIN_SAVED_TOKENS
