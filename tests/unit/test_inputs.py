"""Reading a request's items by input kind (web/inputs.py)."""

import io

import pytest
from flask import Flask, request

from funnel.common.errors import BadInput, UnsupportedMediaType
from funnel.common.store import ModelSpec
from funnel.common.tasks import Task, Upload
from funnel.web.protocols.inputs import read_items

MAX_ITEMS = 4


class Kind(Task):
    """A task that only reads: its input kind and content types."""

    content_types = ("audio/wav", "audio/x-wav", "text/*")

    def __init__(self, kind):
        self.input_kind = kind  # type: ignore[misc]
        self.spec = ModelSpec(name="clips", task="x", path=None, batch_size=1, config={})  # type: ignore[arg-type]

    preprocess = check = collate = postprocess = None  # type: ignore[assignment]


def read(kind, **request_args):
    with Flask(__name__).test_request_context("/", method="POST", **request_args):
        return read_items(Kind(kind), request, MAX_ITEMS)


# -- image -------------------------------------------------------------------

def test_image_from_multipart_and_raw_body(cat_jpeg):
    items, single = read("image", data={"file": (io.BytesIO(cat_jpeg), "cat.jpg")},
                         content_type="multipart/form-data")
    assert single and items == [cat_jpeg]
    items, _ = read("image", data=cat_jpeg, content_type="image/jpeg")
    assert items == [cat_jpeg]


def test_image_wrong_content_type_is_415():
    with pytest.raises(UnsupportedMediaType):
        read("image", data="{}", content_type="application/json")


def test_image_multipart_without_file_field():
    with pytest.raises(BadInput, match="'file'"):
        read("image", data={"other": "x"}, content_type="multipart/form-data")


def test_empty_image():
    with pytest.raises(BadInput) as err:
        read("image", data=b"", content_type="image/png")
    assert err.value.code == "empty_input"


# -- text --------------------------------------------------------------------

def test_text_single_and_many():
    assert read("text", json={"text": "hi"}) == (["hi"], True)
    assert read("text", json={"texts": ["a", "b"]}) == (["a", "b"], False)


@pytest.mark.parametrize("body, code", [
    ({"texts": ["a"] * 5}, "too_many_items"),
    ({"texts": []}, "bad_json"),
    ({"texts": ["a", 3]}, "bad_json"),
    ({"text": 3}, "bad_json"),
    ({"text": "a", "texts": ["b"]}, "bad_json"),
    ({}, "bad_json"),
    ([1, 2], "bad_json"),
])
def test_text_bad_bodies(body, code):
    with pytest.raises(BadInput) as err:
        read("text", json=body)
    assert err.value.code == code


def test_text_bad_json_and_content_type():
    with pytest.raises(BadInput):
        read("text", data="{not json", content_type="application/json")
    with pytest.raises(UnsupportedMediaType):
        read("text", data="hello", content_type="text/plain")


# -- json --------------------------------------------------------------------

def test_json_values_of_any_shape():
    assert read("json", json={"input": [1, 2.5]}) == ([[1, 2.5]], True)
    assert read("json", json={"inputs": [{"a": 1}, "x", None]}) == ([{"a": 1}, "x", None], False)


@pytest.mark.parametrize("body", [{"inputs": [1] * 5}, {"inputs": 1}, {"text": "a"}, {}])
def test_json_bad_bodies(body):
    with pytest.raises(BadInput):
        read("json", json=body)


# -- file --------------------------------------------------------------------

def test_files_from_multipart_one_item_each_and_from_a_raw_body():
    items, single = read("file", data={"file": [(io.BytesIO(b"RIFF1"), "a.wav", "audio/wav"),
                                                (io.BytesIO(b"RIFF2"), "b.wav", "audio/x-wav; charset=x")]},
                         content_type="multipart/form-data")
    assert not single and items == [Upload(b"RIFF1", "audio/wav"), Upload(b"RIFF2", "audio/x-wav")]
    items, single = read("file", data={"file": (io.BytesIO(b"RIFF1"), "a.wav", "audio/wav")},
                         content_type="multipart/form-data")
    assert single and items == [Upload(b"RIFF1", "audio/wav")]
    items, single = read("file", data=b"hello", content_type="text/plain; charset=utf-8")
    assert single and items == [Upload(b"hello", "text/plain")]  # "text/*" takes any text


@pytest.mark.parametrize("args", [
    {"data": b"RIFF", "content_type": "audio/mpeg"},
    {"data": b"RIFF"},
    {"data": {"file": (io.BytesIO(b"%PDF"), "a.pdf", "application/pdf")}, "content_type": "multipart/form-data"},
])
def test_a_file_of_a_type_the_task_does_not_declare_is_415_naming_those_it_does(args):
    with pytest.raises(UnsupportedMediaType, match="clips takes files of audio/wav, audio/x-wav, text/\\*"):
        read("file", **args)


def test_files_empty_missing_or_too_many_are_400():
    with pytest.raises(BadInput, match="item 1: the file is empty"):
        read("file", data={"file": [(io.BytesIO(b"x"), "a.wav", "audio/wav"), (io.BytesIO(b""), "b.wav", "audio/wav")]},
             content_type="multipart/form-data")
    with pytest.raises(BadInput, match="'file'"):
        read("file", data={"other": "x"}, content_type="multipart/form-data")
    with pytest.raises(BadInput, match="5 files in one request; the limit is 4"):
        read("file", data={"file": [(io.BytesIO(b"x"), f"{i}.wav", "audio/wav") for i in range(5)]},
             content_type="multipart/form-data")
