"""The third model: PP-OCRv4's text-line recogniser from rapidocr-onnxruntime's wheel, served beside the
shipped two, through /v1 and /v2, against the wheel's own inference code.

Lines of text are drawn here at the model's height (48 pixels), so that the
wheel's resize (OpenCV's) and ours (Pillow's) are both the identity and the
two read exactly the same tensor; lines drawn at other heights are resized by
each its own way and must still read the same text.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from funnel.scripts.prepare_model import DEFAULT_MODELS, prepare
from funnel.scripts.stack import Stack
from tests.support import http, multipart

MODEL = "text-recognizer"
LINES = ["Hello World", "42", "Funnel batches requests", "Redis 7.0.15",
         "The quick brown fox jumps over the lazy dog", "queue: 3 jobs, 2 workers"]


def draw(text: str, height: int = 48) -> tuple[bytes, np.ndarray]:
    """A line of black text on white: (its PNG, its BGR pixels as OpenCV would read them)."""
    from PIL import Image, ImageDraw, ImageFont

    size = round(height * 2 / 3)
    font = ImageFont.load_default(size=size)
    image = Image.new("RGB", (int(font.getlength(text)) + height // 3, height), "white")
    ImageDraw.Draw(image).text((height // 6, (height - size) // 2 - height // 24), text, fill="black", font=font)
    png = io.BytesIO()
    image.save(png, "PNG")
    return png.getvalue(), np.asarray(image)[:, :, ::-1].copy()


@pytest.fixture(scope="module")
def reference():
    """The wheel's own recogniser (rapidocr-onnxruntime's TextRecognizer), as its config sets it up."""
    import rapidocr_onnxruntime
    from rapidocr_onnxruntime.ch_ppocr_rec import TextRecognizer
    from rapidocr_onnxruntime.utils import read_yaml

    root = Path(rapidocr_onnxruntime.__file__).parent
    config = read_yaml(str(root / "config.yaml"))["Rec"]
    config["model_path"] = str(root / config["model_path"])
    return TextRecognizer(config)


def read(reference, bgr: np.ndarray) -> tuple[str, float]:
    (result,), _ = reference([bgr])
    return result


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    store = tmp_path_factory.mktemp("three-models")
    for name in DEFAULT_MODELS:
        (store / name).symlink_to(model_store / name, target_is_directory=True)
    prepare(store, MODEL)
    with Stack(model_store=store) as running:
        yield running


def predict(stack, png: bytes) -> tuple[int, dict]:
    body, headers = multipart("file", "line.png", png, "image/png")
    status, answer, _ = http("POST", f"{stack.url}/v1/models/{MODEL}/predict", body, headers)
    return status, answer


def infer(stack, pngs: list[bytes]):
    """Triton's own HTTP client: the images as binary data, the outputs as JSON."""
    import tritonclient.http as httpclient

    triton = httpclient.InferenceServerClient(stack.url.removeprefix("http://"))
    given = httpclient.InferInput("IMAGE", [len(pngs)], "BYTES")
    given.set_data_from_numpy(np.array(pngs, dtype=object), binary_data=True)
    wanted = [httpclient.InferRequestedOutput(name, binary_data=False) for name in ("indices", "scores")]
    return triton.infer(MODEL, [given], outputs=wanted)


def test_served_beside_the_shipped_two(stack):
    status, listing, _ = http("GET", f"{stack.url}/v1/models")
    assert status == 200
    names = {m["name"] for m in listing["models"]}
    assert names >= {MODEL, *DEFAULT_MODELS}
    status, answer, _ = http("POST", f"{stack.url}/v1/models/text-embedding/predict", json_body={"text": "hi"})
    assert status == 200 and len(answer["embedding"]) == 384


@pytest.mark.parametrize("text", LINES)
def test_v1_reads_each_line_as_the_wheel_does(stack, reference, text):
    png, bgr = draw(text)
    status, answer = predict(stack, png)
    assert status == 200, answer
    expected_text, expected_confidence = read(reference, bgr)
    assert expected_text.strip() == text  # the line is legible: the comparison means something
    assert answer["text"] == expected_text
    assert answer["confidence"] == pytest.approx(expected_confidence, abs=1e-6)
    assert answer["meta"]["model_version"] == 1


def test_v2_answers_rows_of_each_lines_own_width_that_decode_as_the_wheel_reads(stack, reference):
    drawn = [draw(text) for text in LINES]
    result = infer(stack, [png for png, _ in drawn])
    assert result.get_response()["model_version"] == "1"
    indices = result.get_output("indices")
    widths = [shape[0] for shape in indices["parameters"]["row_shapes"]]
    assert indices["parameters"]["padded"] is True and len(set(widths)) > 1  # rows of different lengths
    rows = result.as_numpy("indices").astype(np.int64)
    probabilities = result.as_numpy("scores")
    decode = reference.postprocess_op.decode
    for (_, bgr), row, probability, width in zip(drawn, rows, probabilities, widths):
        assert not row[width:].any()  # the padding /v2 added, after the row's own columns
        ((text, confidence),) = decode(row[None, :width], probability[None, :width], is_remove_duplicate=True)
        expected_text, expected_confidence = read(reference, bgr)
        assert text == expected_text
        # Lines of one run are padded to its widest: columns of padding may shift the scores a little.
        assert confidence == pytest.approx(expected_confidence, abs=0.02)


@pytest.mark.parametrize("height", [32, 96])
def test_lines_of_other_heights_are_scaled_and_read_alike(stack, reference, height):
    text = "Funnel batches requests"
    png, bgr = draw(text, height)
    status, answer = predict(stack, png)
    assert status == 200, answer
    assert answer["text"].strip() == read(reference, bgr)[0].strip() == text


def test_a_line_longer_than_the_aspect_limit_is_refused(stack):
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (48 * 26, 48), "white").save(png, "PNG")
    status, answer = predict(stack, png.getvalue())
    assert status == 400 and answer["error"]["code"] == "bad_image_shape", answer
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="item 1"):
        infer(stack, [draw("ok")[0], png.getvalue()])
