"""The text recogniser's task on its own: decoding, the shapes it takes, the runs it makes."""

from __future__ import annotations

import io

import numpy as np
import pytest

from funnel.common.errors import BadInput
from funnel.common.store import ModelSpec
from funnel.common.tasks.text_recognition import TextRecognition


@pytest.fixture()
def task(tmp_path) -> TextRecognition:
    (tmp_path / "characters.txt").write_text("a\nb\nc\n", encoding="utf-8")
    config = {"task": "text_recognition", "characters": "characters.txt", "height": 48, "min_width": 320,
              "feeds": ["x"], "run_cost_columns": 64}
    return TextRecognition(ModelSpec(name="ocr", task="text_recognition", path=tmp_path, batch_size=8, config=config))


def test_decoding_merges_repeats_and_drops_blanks(task):
    # classes: 0 blank, 1 a, 2 b, 3 c, 4 space
    indices = np.array([0, 1, 1, 0, 1, 2, 2, 4, 3, 0, 0])
    scores = np.linspace(0.5, 1.0, len(indices)).astype(np.float32)
    result = task.postprocess({"indices": indices, "scores": scores})
    assert result["text"] == "aab c"
    kept = [1, 4, 5, 7, 8]  # the first of each run of a character
    assert result["confidence"] == pytest.approx(float(scores[kept].astype(np.float64).mean()))
    assert task.postprocess({"indices": np.zeros(5, np.int64), "scores": np.ones(5, np.float32)}) == \
        {"text": "", "confidence": 0.0}


def test_preprocess_keeps_the_aspect_ratio_at_the_models_height(task):
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (300, 30), "white").save(png, "PNG")
    pixels = task.preprocess(png.getvalue())["pixels"]
    assert pixels.dtype == np.uint8 and pixels.shape == (48, 480, 3)
    task.check({"pixels": pixels})


@pytest.mark.parametrize("shape", [(32, 100, 3), (48, 0, 3), (48, 48 * 25 + 1, 3), (48, 100), (48, 100, 4)])
def test_check_refuses_other_shapes(task, shape):
    with pytest.raises(BadInput):
        task.check({"pixels": np.zeros(shape, np.uint8)})


def test_collate_pads_to_the_widest_and_at_least_the_trained_width(task):
    short = np.full((48, 100, 3), 255, np.uint8)
    batch = task.collate([{"pixels": short}])["x"]
    assert batch.shape == (1, 3, 48, 320)
    assert (batch[0, :, :, :100] == 1.0).all() and not batch[0, :, :, 100:].any()
    blue = np.zeros((48, 400, 3), np.uint8)
    blue[:, :, 2] = 255  # RGB in, BGR to the model: blue is its first channel
    batch = task.collate([{"pixels": short}, {"pixels": blue}])["x"]
    assert batch.shape == (2, 3, 48, 400)
    assert (batch[1, 0] == 1.0).all() and (batch[1, 2] == -1.0).all()


def test_lines_of_like_width_run_together(task):
    items = [{"pixels": np.zeros((48, w, 3), np.uint8)} for w in (100, 330, 900, 310, 920)]
    runs = task.buckets(items)
    assert sorted(map(sorted, runs)) == [[0, 1, 3], [2, 4]]  # the short ones all padded to 320-330
