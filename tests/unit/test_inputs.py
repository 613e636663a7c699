"""Reading a request's items by input kind (web/inputs.py)."""

import io

import pytest
from flask import Flask, request

from funnel.common.errors import BadInput, UnsupportedMediaType
from funnel.web.protocols.inputs import read_items

MAX_ITEMS = 4


def read(kind, **request_args):
    with Flask(__name__).test_request_context("/", method="POST", **request_args):
        return read_items(kind, request, MAX_ITEMS)


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
