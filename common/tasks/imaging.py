"""Decoding an uploaded image safely (web side, Pillow only): `decode` for any image task, and
`center_crop`, the classifier's square of uint8 RGB pixels.

Every upload costs the web tier a bounded amount, whatever it claims to be. Both
functions go through one guarded open (`_loaded`), so each guard lives here once:

- only JPEG (MPO included), PNG, GIF, WebP, BMP and TIFF are opened: no plugin that
  runs a helper program or parses an exotic container;
- the size in the header is checked before a pixel is decoded: more than
  `max_pixels` pixels is 400 `image_too_large`, a longer side more than
  `max_aspect` times the shorter one is 400 `bad_image_shape` (the task
  chooses: MAX_ASPECT, 10, by default, for a centre crop that would show a
  sliver of the image blown up; a text line may take 20), a JPEG with more than
  MAX_JPEG_SCANS scans is 400 `image_too_complex` (each progressive scan
  walks the whole image again);
- a JPEG is decoded at the smallest of 1/1, 1/2, 1/4, 1/8 scale that keeps
  its shorter side at least the size the task needs (Pillow's `draft`), other
  formats whole;
- one process decodes at most DECODE_BUDGET_PIXELS pixels at a time across
  its threads; a request that cannot get its share within DECODE_WAIT_S is
  503 `busy` (so a burst of large images queues for the CPU instead of
  multiplying the memory);
- only the first frame of an animated GIF/PNG, or the first page of a TIFF,
  is decoded; PNG text chunks are capped (PNG_TEXT_BYTES in all);
- anything Pillow raises on a malformed file is 400 `corrupt_image`, a file it
  cannot identify 400 `not_an_image`;
- the EXIF orientation is applied: `decode` turns the whole image upright;
  `center_crop` turns only its cropped square (a centred square crop commutes
  with the eight orientations, so the rotation costs 224²), and resamples only
  the centre square (`resize(box=...)`, which first averages the box down by
  whole factors), so its work after decoding is about `crop`² pixels whatever
  the image's size.

Pixel modes: 1, L, P (with or without transparency), LA, PA, RGBA, RGB,
CMYK, I;16 (scaled to 8 bits), I, F: alpha is dropped.
"""

from __future__ import annotations

import contextlib
import io
import struct
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from funnel.common.errors import BadInput, Overloaded

if TYPE_CHECKING:
    from PIL import Image as PILImage

FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF")
MAX_ASPECT = 10.0  # longer side / shorter side by default (a phone panorama is about 4 to 8)
MAX_JPEG_SCANS = 100  # libjpeg's progressive script has 10, mozjpeg's optimised ones about 20
DECODE_BUDGET_PIXELS = 48_000_000  # per process, all threads together (about 8 bytes a pixel at peak)
DECODE_WAIT_S = 5.0
PNG_TEXT_BYTES = 1 << 20

# EXIF orientation -> the transpose that shows the picture upright (as ImageOps.exif_transpose).
_ORIENTATION = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE",
                6: "ROTATE_270", 7: "TRANSVERSE", 8: "ROTATE_90"}
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


class PixelBudget:
    """Pixels being decoded in this process at once, across its request threads."""

    def __init__(self, total: int):
        self.total, self.used = total, 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, pixels: int, timeout_s: float):
        pixels = min(pixels, self.total)  # one image alone may always go
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.used + pixels > self.total:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Overloaded("too many large images are being decoded; retry shortly", code="busy")
                self._cond.wait(remaining)
            self.used += pixels
        try:
            yield
        finally:
            with self._cond:
                self.used -= pixels
                self._cond.notify_all()


BUDGET = PixelBudget(DECODE_BUDGET_PIXELS)


def _limit_png_text() -> None:
    from PIL import PngImagePlugin

    PngImagePlugin.MAX_TEXT_CHUNK = min(PngImagePlugin.MAX_TEXT_CHUNK, PNG_TEXT_BYTES)
    PngImagePlugin.MAX_TEXT_MEMORY = min(PngImagePlugin.MAX_TEXT_MEMORY, PNG_TEXT_BYTES)


def check_shape(width: int, height: int, max_pixels: int, max_aspect: float = MAX_ASPECT) -> None:
    """400 for a header over the pixel limit, or whose longer side is over max_aspect times its shorter."""
    if width < 1 or height < 1:
        raise BadInput(f"image is {width}x{height} pixels", code="corrupt_image")
    if width * height > max_pixels:
        raise BadInput(f"image has more than {max_pixels} pixels ({width}x{height})", code="image_too_large")
    if max(width, height) > max_aspect * min(width, height):
        raise BadInput(f"image is {width}x{height} pixels: its longer side is more than {max_aspect:g} times "
                       f"its shorter side, the most this model takes", code="bad_image_shape")


def _orientation(image) -> int:
    try:
        value = image.getexif().get(0x0112, 1)
    except Exception:  # malformed EXIF: show the picture as stored
        return 1
    return value if value in _ORIENTATION else 1


def _resizable(image):
    """The decoded image in a mode Pillow resamples well, converting the whole image only where it must."""
    mode = image.mode
    if mode in ("L", "RGB", "CMYK") or mode in _SIXTEEN_BIT:  # 16 bits: resampled as they are
        return image
    if mode in ("1", "F"):
        return image.convert("L")
    return image.convert("RGB")  # P, PA, LA, RGBA, RGBX, YCbCr, ...: alpha dropped


def _eight_bit(image, mode: str = "RGB"):
    """The image as 8-bit RGB (or L); 16-bit grey (PNG, TIFF) keeps the top 8 bits of each value."""
    if image.mode in _SIXTEEN_BIT:
        from PIL import Image

        values = np.clip(np.asarray(image, dtype=np.int64), 0, 65535) >> 8
        image = Image.fromarray(values.astype(np.uint8), mode="L")
    return image if image.mode == mode else image.convert(mode)


@contextlib.contextmanager
def _loaded(data: bytes, max_pixels: int, max_aspect: float, draft: tuple[str, int] | None
            ) -> Iterator[tuple[PILImage.Image, int]]:
    """The upload decoded under every guard: (its first frame as stored, its EXIF orientation).

    The caller works on the pixels inside the `with`: the decode budget is held
    until it leaves, and whatever Pillow raises there is answered like a bad file.
    `draft` = (mode, side): a JPEG is decoded at the smallest scale whose sides stay >= side.
    """
    from PIL import Image, UnidentifiedImageError

    _limit_png_text()
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=FORMATS)
        width, height = image.size
        check_shape(width, height, max_pixels, max_aspect)
        if image.format in ("JPEG", "MPO"):
            if data.count(b"\xff\xda") > MAX_JPEG_SCANS:  # SOS markers (an upper bound on scans)
                raise BadInput(f"JPEG has more than {MAX_JPEG_SCANS} scans", code="image_too_complex")
            if draft is not None:  # 1/2, 1/4 or 1/8 scale for free
                image.draft(draft[0], (draft[1], draft[1]))
        with BUDGET.hold(image.width * image.height, DECODE_WAIT_S):
            image.load()  # the first frame or page only
            yield image, _orientation(image)
    except Image.DecompressionBombError:
        raise BadInput(f"image has more than {max_pixels} pixels", code="image_too_large") from None
    except UnidentifiedImageError:
        raise BadInput(f"not an image Pillow can read (accepted: {', '.join(FORMATS)})",
                       code="not_an_image") from None
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError, TypeError, ZeroDivisionError,
            struct.error) as exc:  # what Pillow's plugins raise on malformed files
        raise BadInput(f"image could not be decoded: {exc}", code="corrupt_image") from None


def decode(data: bytes, *, max_pixels: int, max_aspect: float = MAX_ASPECT, mode: str = "RGB",
           min_side: int | None = None) -> PILImage.Image:
    """An uploaded image, decoded under every guard above, upright, in `mode` ("RGB" or "L").

    For any image task's `preprocess`: `max_pixels` is the task's limit (400
    `image_too_large` above it), `max_aspect` the longest shape it takes (400
    `bad_image_shape`; a text line may take 20), `min_side` the smallest side
    it will use, which lets a JPEG be decoded at 1/2, 1/4 or 1/8 scale while
    both sides stay at least that (None: full size). Alpha is dropped, 16-bit
    grey keeps its top 8 bits.
    """
    if mode not in ("RGB", "L"):
        raise ValueError(f"decode gives RGB or L images, not {mode!r}")
    from PIL import Image

    with _loaded(data, max_pixels, max_aspect, None if min_side is None else (mode, min_side)) as (image, turn):
        image = _eight_bit(_resizable(image), mode)
        if turn != 1:
            image = image.transpose(getattr(Image.Transpose, _ORIENTATION[turn]))
        image.load()
    return image


def center_crop(data: bytes, resize: int, crop: int, max_pixels: int) -> np.ndarray:
    """Decode, scale so the shorter side is `resize`, and return the centre `crop` x `crop` square."""
    from PIL import Image

    with _loaded(data, max_pixels, MAX_ASPECT, ("RGB", resize)) as (image, orientation):
        image = _resizable(image)
        w, h = image.size
        side = min(w, h) * min(1.0, crop / resize)  # the crop, in decoded pixels
        box = ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)
        # reduce() first averages the box down by whole factors (not for 16 bits, which Pillow lacks).
        gap = None if image.mode in _SIXTEEN_BIT else 3.0
        out = image.resize((crop, crop), Image.Resampling.BILINEAR, box=box, reducing_gap=gap)
    if orientation != 1:
        out = out.transpose(getattr(Image.Transpose, _ORIENTATION[orientation]))
    return np.asarray(_eight_bit(out), dtype=np.uint8)
