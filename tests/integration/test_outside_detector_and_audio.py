"""Two models from outside, added with `funnel add` as docs/models.md walks through, answering as their
own code does in-process on the same bytes.

- toydetect (tests/third_party/toydetect): a YOLOv8-shaped detector whose task
  letterboxes in the web tier and keeps the scale, padding and image size as
  the item's context, so the worker answers boxes in the original image's pixels.
- toyaudio (tests/third_party/toyaudio): WAV files through the `file` input
  kind, resampled to 16 kHz in the web tier; a batch is padded to its longest
  clip, and each clip's length is its context, so its answer holds its own frames.

Each is compared with the package's own function (toydetect.detect.detect,
toyaudio.audio.levels) run here with onnxruntime: images of several aspect
ratios and clips of several sample rates, widths and lengths, one at a time and
batched, through /v1 (the Python client, the CLI) and /v2 (tritonclient: the raw rows).
"""

from __future__ import annotations

import importlib
import io
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from funnel.scripts.stack import Stack
from funnel_client import BadRequest, Client, FunnelHTTPError
from tests import outside_models, toy_model
from tests.support import ROOT, http

DETECT, LEVELS = "toy-detect", "clip-levels"

SHAPES = [(100, 48), (40, 120), (64, 64), (200, 30), (33, 77)]  # width, height
CLIPS = [(8_000, 2, 1, 900), (11_025, 2, 2, 4_000), (16_000, 2, 1, 16_000), (22_050, 1, 1, 3_333),
         (44_100, 4, 2, 20_000), (48_000, 2, 1, 7_777)]  # rate, sample width, channels, frames


def image(width: int, height: int, seed: int) -> bytes:
    """A PNG of noise with a few bright blocks: every cell of the detector's grid scores differently."""
    rng = np.random.default_rng(seed)
    pixels = (rng.random((height, width, 3)) * 160).astype(np.uint8)
    for channel in range(3):
        x, y = rng.integers(0, width // 2), rng.integers(0, height // 2)
        pixels[y:y + height // 3, x:x + width // 3, channel] = 250
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def clip(rate: int, width: int, channels: int, count: int, seed: int, loud: float = 0.4) -> bytes:
    """A WAV of a tone with a rising envelope and noise, of this rate, sample width and channels."""
    rng = np.random.default_rng(seed)
    t = np.arange(count) / rate
    wave_ = loud * np.linspace(0.05, 1, count) * np.sin(2 * np.pi * (220 + 40 * seed) * t) \
        + (0.01 if loud else 0.0) * rng.normal(size=count)
    wave_ = np.repeat(wave_[:, None], channels, axis=1)
    if width == 1:
        data = np.clip(wave_ * 127 + 128, 0, 255).astype(np.uint8)
    else:
        full = 2 ** (8 * width - 1) - 1
        data = np.clip(wave_ * full, -full, full).astype(f"<i{width}")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data.tobytes())
    return out.getvalue()


IMAGES = [image(w, h, i) for i, (w, h) in enumerate(SHAPES)]
WAVS = [clip(*spec, seed=i) for i, spec in enumerate(CLIPS)]
SILENT = clip(16_000, 2, 1, 3_200, seed=9, loud=0.0)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("graphs")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, graphs):
    store = tmp_path_factory.mktemp("store")
    outside_models.add_detector(store, graphs, DETECT)
    outside_models.add_levels(store, graphs, LEVELS)
    env = {"PYTHONPATH": toy_model.outside_env()["PYTHONPATH"]}
    with Stack(model_store=store, web_env=env, worker_env=env) as running:
        yield running


@pytest.fixture(scope="module")
def local(graphs, stack):
    """The packages' own functions on onnxruntime sessions of the same graphs: no Funnel (the packages
    imported as their user would, with their folder on the path)."""
    import onnxruntime as ort

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(toy_model.PACKAGE_DIR))
        detect = importlib.import_module("toydetect.detect")
        audio = importlib.import_module("toyaudio.audio")
    detector = ort.InferenceSession(str(graphs / "detect.onnx"), providers=["CPUExecutionProvider"])
    levels = ort.InferenceSession(str(graphs / "levels.onnx"), providers=["CPUExecutionProvider"])
    return {"detect": lambda data: detect.detect(detector, data, outside_models.SIZE, outside_models.DETECT_LABELS),
            "levels": lambda data: audio.levels(levels, data), "detector": detector, "letterbox": detect.letterbox}


def same_detections(got: list[dict], want: list[dict]) -> None:
    """Boxes to the pixel (half of one at most), scores to 1e-4, labels and order alike."""
    assert want, "the image should hold something to detect"
    assert [d["label"] for d in got] == [d["label"] for d in want]
    np.testing.assert_allclose([d["box"] for d in got], [d["box"] for d in want], atol=0.5)
    np.testing.assert_allclose([d["score"] for d in got], [d["score"] for d in want], atol=1e-4)


def same_levels(got: dict, want: dict) -> None:
    """The clip's own frames, no more, each level to 1e-4 dB; its length and rate as read."""
    assert len(got["levels_db"]) == len(want["levels_db"])
    np.testing.assert_allclose(got["levels_db"], want["levels_db"], atol=1e-4)
    assert got["seconds"] == want["seconds"] and got["sample_rate"] == want["sample_rate"]


# -- the detector --------------------------------------------------------------

def test_detections_one_at_a_time_are_in_the_original_pixels(stack, local):
    with Client(stack.url) as client:
        for data, (width, height) in zip(IMAGES, SHAPES):
            got = client.predict(DETECT, image=data)
            same_detections(got["detections"], local["detect"](data))
            boxes = np.array([d["box"] for d in got["detections"]])
            assert boxes[:, [0, 2]].max() <= width and boxes[:, [1, 3]].max() <= height
            assert boxes[:, 2].max() > outside_models.SIZE or boxes[:, 3].max() > outside_models.SIZE \
                or max(width, height) <= outside_models.SIZE  # not the letterboxed square's


def test_detections_batched_together_keep_each_image_s_context(stack, local):
    want = [local["detect"](data) for data in IMAGES]
    batched = False
    with Client(stack.url, workers=len(IMAGES)) as client:
        for _ in range(10):  # until the worker has run several of them in one batch
            answers = [f.result() for f in [client.submit(DETECT, data) for data in IMAGES]]
            for got, expected in zip(answers, want):
                same_detections(got["detections"], expected)
            if any(a["meta"]["batch_size"] > 1 for a in answers):
                batched = True
                break
    assert batched


def test_v2_answers_the_raw_rows_unchanged(stack, local):
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(stack.url.removeprefix("http://")) as triton:
        given = httpclient.InferInput("IMAGE", [len(IMAGES)], "BYTES")
        given.set_data_from_numpy(np.array(IMAGES, dtype=object))
        rows = triton.infer(DETECT, [given]).as_numpy("output0")
        metadata = triton.get_model_metadata(DETECT)
    for row, data in zip(rows, IMAGES):
        pixels, _, _ = local["letterbox"](Image.open(io.BytesIO(data)).convert("RGB"), outside_models.SIZE)
        (want,) = local["detector"].run(["output0"], {"images": pixels[None]})
        np.testing.assert_allclose(row, want[0], atol=1e-5)
    assert [o["name"] for o in metadata["outputs"]] == ["output0"]


# -- the audio model -------------------------------------------------------------

def test_levels_one_clip_at_a_time(stack, local):
    with Client(stack.url) as client:
        for data, (rate, *_rest) in zip(WAVS, CLIPS):
            got = client.predict(LEVELS, file=data)
            same_levels(got, local["levels"](data))
            assert got["sample_rate"] == rate and got["meta"]["batch_size"] >= 1


def test_levels_of_clips_batched_in_one_request_are_each_clip_s_own(stack, local):
    with Client(stack.url) as client:
        got = client.predict(LEVELS, files=WAVS)
    assert len(got["results"]) == len(WAVS) and {m["batch_size"] for m in got["meta"]} == {len(WAVS)}
    for answer, data in zip(got["results"], WAVS):
        same_levels(answer, local["levels"](data))


def test_a_bulk_job_of_files_keeps_each_clip_s_context(stack, local):
    with Client(stack.url) as client:
        job = client.submit_job(LEVELS, files=WAVS + [SILENT])
        assert client.wait(job["id"], timeout=60)["state"] == "done"
        results = list(client.results(job["id"]))
    for answer, data in zip(results, WAVS):
        same_levels(answer, local["levels"](data))
    assert "the clip is silent" in results[-1]["error"]["message"]  # its own item's error alone


def test_v2_takes_files_as_a_bytes_input_and_answers_the_raw_levels(stack, local):
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(stack.url.removeprefix("http://")) as triton:
        given = httpclient.InferInput("FILE", [len(WAVS)], "BYTES")
        given.set_data_from_numpy(np.array(WAVS, dtype=object))
        rows = triton.infer(LEVELS, [given]).as_numpy("levels")
    for row, data in zip(rows, WAVS):
        want = local["levels"](data)["levels_db"]
        np.testing.assert_allclose(row[:len(want)], want, atol=1e-4)  # then the batch's padding


def test_v2_names_a_file_s_content_type_in_its_parameters(stack, local):
    data = WAVS[0]
    body = {"inputs": [{"name": "FILE", "datatype": "BYTES", "shape": [1], "data": [data.decode("latin-1")],
                        "parameters": {"content_type": "audio/mpeg"}}]}
    status, answer, _ = http("POST", f"{stack.url}/v2/models/{LEVELS}/infer", json_body=body)
    assert status == 415 and "audio/wav" in answer["error"], answer


def test_a_file_of_another_type_is_415_naming_those_the_task_takes(stack):
    status, body, _ = http("POST", f"{stack.url}/v1/models/{LEVELS}/predict", body=WAVS[0],
                           headers={"Content-Type": "audio/mpeg"})
    assert status == 415, body
    assert body["error"]["message"] == (f"{LEVELS} takes files of audio/wav, audio/x-wav, audio/wave, "
                                        "audio/vnd.wave, not audio/mpeg")


@pytest.mark.parametrize("bad", [b"RIFF....WAVEfmt nonsense", WAVS[0][:30], b"\x00" * 64,
                                 WAVS[0][:20] + b"\x03\x00" + WAVS[0][22:]])  # IEEE float: not PCM
def test_a_file_the_task_cannot_read_is_a_400_with_its_message(stack, bad):
    status, body, _ = http("POST", f"{stack.url}/v1/models/{LEVELS}/predict", body=bad,
                           headers={"Content-Type": "audio/wav"})
    assert status == 400, body
    assert body["error"]["code"] == "bad_audio" and body["error"]["message"].startswith("cannot read the clip: ")
    with Client(stack.url) as client, pytest.raises(BadRequest) as err:
        client.predict(LEVELS, files=[WAVS[1], (bad, "audio/wav")])
    assert err.value.code == "bad_audio" and err.value.message.startswith("item 1: cannot read the clip")


def test_a_task_that_raises_in_postprocess_fails_its_item_s_request_alone(stack, local):
    with Client(stack.url, workers=4) as client:
        for _ in range(10):  # until the silent clip shares a batch with another request's
            alone = [client.submit(LEVELS, file=SILENT), client.submit(LEVELS, file=WAVS[2])]
            with pytest.raises(FunnelHTTPError) as err:
                alone[0].result()
            assert err.value.status == 500 and err.value.code == "inference_failed"
            assert "the clip is silent" in err.value.message
            fine = alone[1].result()
            same_levels(fine, local["levels"](WAVS[2]))
            if fine["meta"]["batch_size"] > 1:
                break
        with pytest.raises(FunnelHTTPError) as err:
            client.predict(LEVELS, files=[WAVS[0], SILENT, WAVS[1]])
    assert err.value.status == 500 and err.value.message.startswith("item 1: ValueError: the clip is silent")


def test_the_cli_sends_files(stack, tmp_path, local):
    paths = []
    for i, data in enumerate(WAVS[:2]):
        paths += ["--file", str(tmp_path / f"{i}.wav")]
        (tmp_path / f"{i}.wav").write_bytes(data)
    done = subprocess.run([str(Path(sys.executable).parent / "funnel-client"), "--url", stack.url,
                           "--model", LEVELS, *paths, "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    import json
    for answer, data in zip(json.loads(done.stdout)["results"], WAVS):
        same_levels(answer, local["levels"](data))


def test_listed_and_offered_with_a_file_picker_of_its_types(stack):
    status, body, _ = http("GET", f"{stack.url}/v1/models/{LEVELS}")
    assert status == 200 and body["input_kind"] == "file"
    assert body["content_types"] == ["audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"]
    page = http("GET", f"{stack.url}/")[1]["_text"]
    assert f'data-model="{LEVELS}"' in page and 'data-kind="file"' in page
    assert 'type="file" name="file" accept="audio/wav,audio/x-wav,audio/wave,audio/vnd.wave" multiple' in page


def test_funnel_source_knows_nothing_of_them():
    for folder in ("common", "web", "worker"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".html", ".js", ".json"):
                text = path.read_text()
                assert "toydetect" not in text and "toyaudio" not in text, path
