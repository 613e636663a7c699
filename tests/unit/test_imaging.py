"""Every upload costs the web tier a bounded amount: center_crop and decode under hostile shapes, modes, frames,
metadata.

The property test generates images across sizes (1 px to past the pixel
limit, any aspect ratio), pixel modes, formats, frames, EXIF orientations and
text chunks, and checks each is answered (a 224x224x3 uint8 array, or a
BadInput with a known code) within a CPU-time and peak-memory budget
measured around the call. Memory is the process's peak resident set, reset
before each call through /proc/self/clear_refs (Pillow allocates outside
tracemalloc's view), or tracemalloc's peak where that file cannot be written.
"""

from __future__ import annotations

import io
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, PngImagePlugin

from funnel.common.errors import BadInput, Overloaded
from funnel.common.tasks import imaging
from funnel.common.tasks.imaging import MAX_ASPECT, MAX_JPEG_SCANS, PixelBudget, center_crop, decode
from tests.support import jpeg_bytes

RESIZE, CROP = 256, 224
LIMIT = 250_000  # a small pixel limit keeps the generated images cheap to make
CPU_BUDGET_S = 0.4
MEMORY_BUDGET_MB = 48
CODES = {"image_too_large", "bad_image_shape", "corrupt_image", "not_an_image", "image_too_complex"}

# Pixel modes each format can store (Pillow's writers).
MODES = {
    "PNG": ["1", "L", "P", "P+transparency", "LA", "RGB", "RGBA", "I;16"],
    "JPEG": ["L", "RGB", "CMYK"],
    "GIF": ["P", "L", "P+transparency"],
    "TIFF": ["1", "L", "RGB", "RGBA", "CMYK", "I;16"],
    "BMP": ["1", "L", "P", "RGB"],
}
MAX_SIDE = {"JPEG": 65500, "GIF": 65535}  # what the format can hold


def _clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


RSS = _clear_refs_works()


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def measured(call):
    """(result or exception, CPU seconds, peak MiB above the start) of one call."""
    if RSS:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # peak RSS := current RSS
        start_kb = _status_kb("VmRSS")
    else:
        tracemalloc.start()
    cpu = time.process_time()
    try:
        result = call()
    except BadInput as exc:
        result = exc
    cpu = time.process_time() - cpu
    if RSS:
        peak_mb = (_status_kb("VmHWM") - start_kb) / 1024
    else:
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return result, cpu, peak_mb


def make_image(fmt: str, mode: str, width: int, height: int, frames: int = 1, orientation: int = 1,
               text_kb: int = 0, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    transparency = mode.endswith("+transparency")
    mode = mode.split("+")[0]
    # A gradient with some noise: compresses like a picture, not like a blank.
    base = (np.add.outer(np.arange(height) * 7, np.arange(width) * 3) % 256).astype(np.uint8)
    base ^= rng.integers(0, 16, size=base.shape, dtype=np.uint8)
    grey = Image.fromarray(base, "L")
    if mode == "I;16":
        image = Image.fromarray(base.astype(np.uint16) * 257)
    elif mode == "P":
        image = grey.convert("RGB").quantize(16)
    else:
        image = grey.convert(mode)
    extra: dict = {}
    if transparency:
        extra["transparency"] = 0
    if frames > 1 and fmt in ("GIF", "PNG"):
        extra.update(save_all=True, append_images=[image.copy() for _ in range(frames - 1)])
    if orientation != 1 and fmt in ("JPEG", "PNG", "TIFF"):
        exif = Image.Exif()
        exif[0x0112] = orientation
        extra["exif"] = exif.tobytes()
    if text_kb and fmt == "PNG":
        info = PngImagePlugin.PngInfo()
        for i in range(4):
            info.add_text(f"comment{i}", "x" * (text_kb * 256), zip=True)
        extra["pnginfo"] = info
    out = io.BytesIO()
    image.save(out, format=fmt, **extra)
    return out.getvalue()


@st.composite
def images(draw):
    fmt = draw(st.sampled_from(sorted(MODES)))
    mode = draw(st.sampled_from(MODES[fmt]))
    # Sides from 1 to the whole limit, shapes from square to a one-pixel strip either way,
    # and some past the limit; the product stays within twice the limit to keep them cheap.
    long_side = draw(st.integers(1, MAX_SIDE.get(fmt, 2 * LIMIT)))
    short_side = draw(st.integers(1, max(1, min(long_side, (2 * LIMIT) // long_side))))
    width, height = (long_side, short_side) if draw(st.booleans()) else (short_side, long_side)
    return dict(fmt=fmt, mode=mode, width=width, height=height,
                frames=draw(st.sampled_from([1, 1, 3])), orientation=draw(st.integers(1, 8)),
                text_kb=draw(st.sampled_from([0, 0, 64])), seed=draw(st.integers(0, 3)))


def check_answer(result, spec) -> None:
    if isinstance(result, BadInput):
        assert result.status == 400 and result.code in CODES and result.message, (spec, result)
        return
    assert isinstance(result, np.ndarray), (spec, result)
    assert result.dtype == np.uint8 and result.shape == (CROP, CROP, 3), spec


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=images())
def test_any_image_is_answered_within_a_fixed_cpu_and_memory_budget(spec):
    data = make_image(**spec)
    result, cpu_s, peak_mb = measured(lambda: center_crop(data, RESIZE, CROP, LIMIT))
    check_answer(result, spec)
    assert cpu_s < CPU_BUDGET_S, (spec, cpu_s)
    assert peak_mb < MEMORY_BUDGET_MB, (spec, peak_mb)
    w, h = spec["width"], spec["height"]
    if w * h <= LIMIT and max(w, h) <= MAX_ASPECT * min(w, h):
        assert isinstance(result, np.ndarray), spec  # a fair image is never refused


@pytest.mark.parametrize("width, height", [(20000, 1), (1, 40000), (40000, 1), (11, 1), (1000, 99)])
def test_a_strip_is_refused_before_it_is_decoded(width, height):
    data = make_image("PNG", "L", width, height)
    result, cpu_s, _ = measured(lambda: center_crop(data, RESIZE, CROP, 40_000_000))
    assert isinstance(result, BadInput) and result.code == "bad_image_shape"
    assert f"{width}x{height}" in result.message and f"{MAX_ASPECT:g} times" in result.message
    assert cpu_s < 0.05


@pytest.mark.parametrize("width, height", [(1, 1), (3, 2), (10, 1), (1, 10), (300, 30)])
def test_small_and_thin_shapes_within_the_bound_are_cropped(width, height):
    assert center_crop(make_image("PNG", "RGB", width, height), RESIZE, CROP, LIMIT).shape == (CROP, CROP, 3)


@pytest.mark.parametrize("mode", ["L", "RGBA", "I;16"])
def test_a_large_image_costs_one_decode_and_a_crop_sized_resample(mode):
    """Near the default limit, in the costliest modes: one decode, not a resize of the whole image."""
    out = io.BytesIO()
    Image.new(mode, (6000, 6000), 200).save(out, format="PNG")  # 36 Mpx in a few hundred KB
    data = out.getvalue()
    result, cpu_s, peak_mb = measured(lambda: center_crop(data, RESIZE, CROP, 40_000_000))
    assert isinstance(result, np.ndarray)
    assert cpu_s < 3.0 and peak_mb < 400, (cpu_s, peak_mb)


def test_exif_orientation_is_applied():
    """A phone photo stored sideways with orientation 6 is classified upright."""
    upright = np.zeros((300, 400, 3), np.uint8)
    upright[:150] = 255  # white top half
    stored = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)  # as the sensor wrote it
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    out = io.BytesIO()
    stored.save(out, format="JPEG", exif=exif.tobytes(), quality=95)
    pixels = center_crop(out.getvalue(), RESIZE, CROP, LIMIT)
    assert pixels[:90].mean() > 200 and pixels[-90:].mean() < 50  # white on top, black below


@pytest.mark.parametrize("orientation", range(1, 9))
def test_each_orientation_matches_pillows_exif_transpose(orientation, cat_jpeg):
    from PIL import ImageOps

    exif = Image.Exif()
    exif[0x0112] = orientation
    src = Image.open(io.BytesIO(cat_jpeg))
    out = io.BytesIO()
    src.save(out, format="PNG", exif=exif.tobytes())
    ours = center_crop(out.getvalue(), RESIZE, CROP, 1_000_000).astype(int)
    reference = io.BytesIO()
    ImageOps.exif_transpose(Image.open(io.BytesIO(out.getvalue()))).save(reference, format="PNG")
    theirs = center_crop(reference.getvalue(), RESIZE, CROP, 1_000_000).astype(int)
    assert np.abs(ours - theirs).mean() < 1.0


def test_sixteen_bit_grey_keeps_its_contrast():
    ramp = (np.arange(300 * 300, dtype=np.uint64).reshape(300, 300) * 65535 // (300 * 300 - 1)).astype(np.uint16)
    out = io.BytesIO()
    Image.fromarray(ramp).save(out, format="PNG")
    pixels = center_crop(out.getvalue(), RESIZE, CROP, LIMIT)
    assert pixels.min() < 40 and pixels.max() > 215  # scaled to 8 bits, not clipped to white


def test_only_the_first_frame_is_decoded():
    frames = [Image.new("RGB", (64, 64), color) for color in ("red", "blue", "green")]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    pixels = center_crop(out.getvalue(), RESIZE, CROP, LIMIT)
    assert pixels[..., 0].mean() > 200 and pixels[..., 2].mean() < 50


def test_a_jpeg_with_too_many_scans_is_refused(cat_jpeg):
    # An APP15 segment holding SOS markers: the count is a cheap upper bound on the scans.
    junk = b"\xff\xda" * (MAX_JPEG_SCANS + 1)
    segment = b"\xff\xef" + (len(junk) + 2).to_bytes(2, "big") + junk
    result, _, _ = measured(lambda: center_crop(cat_jpeg[:2] + segment + cat_jpeg[2:], RESIZE, CROP, LIMIT))
    assert isinstance(result, BadInput) and result.code == "image_too_complex"


def test_a_progressive_jpeg_is_fine():
    out = io.BytesIO()
    Image.fromarray(np.full((500, 700, 3), 90, np.uint8)).save(out, format="JPEG", progressive=True)
    assert center_crop(out.getvalue(), RESIZE, CROP, 1_000_000).shape == (CROP, CROP, 3)


def test_formats_outside_the_list_are_not_opened():
    out = io.BytesIO()
    Image.new("RGB", (50, 50)).save(out, format="PPM")
    with pytest.raises(BadInput) as caught:
        center_crop(out.getvalue(), RESIZE, CROP, LIMIT)
    assert caught.value.code == "not_an_image" and "PNG" in caught.value.message


def test_a_png_with_a_text_chunk_bomb_is_refused_cheaply():
    data = make_image("PNG", "RGB", 50, 50, text_kb=4096)  # 4 MiB of text per chunk, deflated
    result, cpu_s, _ = measured(lambda: center_crop(data, RESIZE, CROP, LIMIT))
    assert isinstance(result, (np.ndarray, BadInput))
    assert cpu_s < 0.2


def test_the_decode_budget_bounds_concurrent_decoding(monkeypatch):
    budget = PixelBudget(100)
    inside, most = [0], [0]
    lock = threading.Lock()

    def one(pixels):
        with budget.hold(pixels, timeout_s=5):
            with lock:
                inside[0] += min(pixels, budget.total)  # one image alone may take it all
                most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= min(pixels, budget.total)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, [60, 60, 30, 30, 500, 10, 90, 40]))
    assert most[0] <= 100 and budget.used == 0
    with budget.hold(100, timeout_s=1):
        with pytest.raises(Overloaded) as caught:
            with budget.hold(1, timeout_s=0.05):
                pass
    assert caught.value.status == 503 and caught.value.code == "busy"
    monkeypatch.setattr(imaging, "BUDGET", budget)
    assert center_crop(jpeg_bytes(np.zeros((300, 300, 3), np.uint8)), RESIZE, CROP, LIMIT).shape == (CROP, CROP, 3)



# -- decode: the same guards for any image task, with the task's own aspect limit ---------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=images(), mode=st.sampled_from(["RGB", "L"]))
def test_decode_answers_any_image_within_the_same_budget(spec, mode):
    data = make_image(**spec)
    result, cpu_s, peak_mb = measured(lambda: decode(data, max_pixels=LIMIT, max_aspect=20, mode=mode))
    if isinstance(result, BadInput):
        assert result.status == 400 and result.code in CODES and result.message, (spec, result)
    else:
        w, h = spec["width"], spec["height"]
        assert result.mode == mode and sorted(result.size) == sorted((w, h)), spec
    assert cpu_s < CPU_BUDGET_S, (spec, cpu_s)
    assert peak_mb < MEMORY_BUDGET_MB, (spec, peak_mb)
    w, h = spec["width"], spec["height"]
    if w * h <= LIMIT and max(w, h) <= 20 * min(w, h):
        assert not isinstance(result, BadInput), spec  # a fair image is never refused


def test_decode_refuses_a_strip_at_ten_to_one_but_takes_a_text_line_at_twenty():
    strip = make_image("PNG", "L", 40000, 1)
    result, cpu_s, _ = measured(lambda: decode(strip, max_pixels=40_000_000))
    assert isinstance(result, BadInput) and result.code == "bad_image_shape"
    assert "40000x1" in result.message and "10 times" in result.message and cpu_s < 0.05
    line = make_image("PNG", "RGB", 200, 10)
    with pytest.raises(BadInput) as caught:
        decode(line, max_pixels=LIMIT)  # 20:1 is past the default
    assert caught.value.code == "bad_image_shape"
    image = decode(line, max_pixels=LIMIT, max_aspect=20)
    assert image.size == (200, 10) and image.mode == "RGB"
    assert np.asarray(image).shape == (10, 200, 3)
    tall = decode(make_image("PNG", "L", 10, 200), max_pixels=LIMIT, max_aspect=20, mode="L")
    assert tall.size == (10, 200) and tall.mode == "L"
    with pytest.raises(BadInput) as caught:
        decode(make_image("PNG", "L", 211, 10), max_pixels=LIMIT, max_aspect=20)
    assert caught.value.code == "bad_image_shape" and "20 times" in caught.value.message


def test_decode_refuses_a_decompression_bomb_from_its_header():
    out = io.BytesIO()
    Image.new("L", (8000, 8000)).save(out, format="PNG")  # 64 Mpx of zeros in about 64 KB
    data = out.getvalue()
    assert len(data) < 200_000
    result, cpu_s, peak_mb = measured(lambda: decode(data, max_pixels=40_000_000))
    assert isinstance(result, BadInput) and result.code == "image_too_large" and "8000x8000" in result.message
    assert cpu_s < 0.05 and peak_mb < 16


def test_decode_refuses_a_jpeg_of_too_many_scans(cat_jpeg):
    junk = b"\xff\xda" * (MAX_JPEG_SCANS + 1)
    segment = b"\xff\xef" + (len(junk) + 2).to_bytes(2, "big") + junk
    with pytest.raises(BadInput) as caught:
        decode(cat_jpeg[:2] + segment + cat_jpeg[2:], max_pixels=LIMIT)
    assert caught.value.code == "image_too_complex"


@pytest.mark.parametrize("fmt", ["PPM", "ICO", "PDF"])
def test_decode_opens_only_the_listed_formats(fmt):
    out = io.BytesIO()
    Image.new("RGB", (50, 50)).save(out, format=fmt)
    with pytest.raises(BadInput) as caught:
        decode(out.getvalue(), max_pixels=LIMIT)
    assert caught.value.code == "not_an_image" and "JPEG" in caught.value.message


@pytest.mark.parametrize("data", [b"", b"\x89PNG\r\n\x1a\n" + b"\0" * 40, b"GIF89a" + b"\xff" * 20])
def test_decode_answers_garbage_with_a_400(data):
    with pytest.raises(BadInput) as caught:
        decode(data, max_pixels=LIMIT)
    assert caught.value.status == 400 and caught.value.code in CODES


def test_decode_turns_the_image_upright():
    upright = np.zeros((30, 400, 3), np.uint8)
    upright[:, :200] = 255  # white left half
    stored = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)  # as the sensor wrote it: 30 wide
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    stored.save(out, format="JPEG", exif=exif.tobytes(), quality=95)
    pixels = np.asarray(decode(out.getvalue(), max_pixels=LIMIT, max_aspect=20))
    assert pixels.shape == (30, 400, 3)
    assert pixels[:, :180].mean() > 200 and pixels[:, 220:].mean() < 50


def test_decode_draws_a_jpeg_at_the_smallest_scale_that_keeps_min_side():
    data = jpeg_bytes(np.full((800, 1600, 3), 128, np.uint8))
    assert decode(data, max_pixels=LIMIT * 8).size == (1600, 800)
    assert decode(data, max_pixels=LIMIT * 8, min_side=100, mode="L").size == (200, 100)  # 1/8
    assert decode(data, max_pixels=LIMIT * 8, min_side=300).size == (800, 400)  # 1/2: 1/4 would be 200 high


def test_decode_keeps_sixteen_bit_contrast_and_drops_alpha():
    ramp = (np.arange(300 * 30, dtype=np.uint64).reshape(30, 300) * 65535 // (300 * 30 - 1)).astype(np.uint16)
    out = io.BytesIO()
    Image.fromarray(ramp).save(out, format="PNG")
    grey = np.asarray(decode(out.getvalue(), max_pixels=LIMIT, max_aspect=20, mode="L"))
    assert grey.dtype == np.uint8 and grey.min() < 5 and grey.max() > 250
    out = io.BytesIO()
    Image.new("RGBA", (40, 20), (10, 20, 30, 0)).save(out, format="PNG")
    assert decode(out.getvalue(), max_pixels=LIMIT).mode == "RGB"
    with pytest.raises(ValueError):
        decode(out.getvalue(), max_pixels=LIMIT, mode="RGBA")


def test_decode_takes_its_share_of_the_decode_budget(monkeypatch):
    budget = PixelBudget(100)
    monkeypatch.setattr(imaging, "BUDGET", budget)
    monkeypatch.setattr(imaging, "DECODE_WAIT_S", 0.05)
    with budget.hold(100, timeout_s=1):
        with pytest.raises(Overloaded) as caught:
            decode(make_image("PNG", "RGB", 20, 20), max_pixels=LIMIT)
        assert budget.used == 100  # its own share was never taken
    assert caught.value.code == "busy" and budget.used == 0
    assert decode(make_image("PNG", "RGB", 20, 20), max_pixels=LIMIT).size == (20, 20)
