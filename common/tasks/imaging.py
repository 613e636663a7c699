"""Decoding an uploaded image into the model's square of uint8 RGB pixels (web side, Pillow only).

Every upload costs the web tier a bounded amount, whatever it claims to be:

- only JPEG (MPO included), PNG, GIF, WebP, BMP and TIFF are opened: no plugin that
  runs a helper program or parses an exotic container;
- the size in the header is checked before a pixel is decoded: more than
  `max_pixels` pixels is 400 `image_too_large`, a longer side more than
  MAX_ASPECT times the shorter one is 400 `bad_image_shape` (its centre
  square would show a sliver of it, blown up), a JPEG with more than
  MAX_JPEG_SCANS scans is 400 `image_too_complex` (each progressive scan
  walks the whole image again);
- a JPEG is decoded at the smallest of 1/1, 1/2, 1/4, 1/8 scale that keeps
  its shorter side at least `resize` (Pillow's `draft`), other formats whole;
- one process decodes at most DECODE_BUDGET_PIXELS pixels at a time across
  its threads; a request that cannot get its share within DECODE_WAIT_S is
  503 `busy` (so a burst of large images queues for the CPU instead of
  multiplying the memory);
- only the centre square is resampled (`resize(box=...)`, which first
  averages the box down by whole factors), so the work after decoding is
  about `crop`² pixels whatever the image's size;
- only the first frame of an animated GIF/PNG, or the first page of a TIFF,
  is decoded; PNG text chunks are capped (PNG_TEXT_BYTES in all);
- the EXIF orientation is applied to the cropped square (a centred square
  crop commutes with the eight orientations, so the rotation costs 224²).

Pixel modes: 1, L, P (with or without transparency), LA, PA, RGBA, RGB,
CMYK, I;16 (scaled to 8 bits), I, F: alpha is dropped, as before.
"""

from __future__ import annotations

import contextlib
import io
import struct
import threading
import time

import numpy as np

from funnel.common.errors import BadInput, Overloaded

FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF")
MAX_ASPECT = 10  # longer side / shorter side (a phone panorama is about 4 to 8)
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


def check_shape(width: int, height: int, max_pixels: int) -> None:
    """400 for a header whose size is over the pixel limit or too thin to crop a square from."""
    if width < 1 or height < 1:
        raise BadInput(f"image is {width}x{height} pixels", code="corrupt_image")
    if width * height > max_pixels:
        raise BadInput(f"image has more than {max_pixels} pixels ({width}x{height})", code="image_too_large")
    if max(width, height) > MAX_ASPECT * min(width, height):
        raise BadInput(f"image is {width}x{height} pixels: its longer side is more than {MAX_ASPECT} times "
                       f"its shorter side, too thin for a centre crop", code="bad_image_shape")


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


def _eight_bit(image):
    """The cropped square as 8-bit RGB; 16-bit grey (PNG, TIFF) keeps the top 8 bits of each value."""
    if image.mode in _SIXTEEN_BIT:
        from PIL import Image

        values = np.clip(np.asarray(image, dtype=np.int64), 0, 65535) >> 8
        image = Image.fromarray(values.astype(np.uint8), mode="L")
    return image.convert("RGB")


def center_crop(data: bytes, resize: int, crop: int, max_pixels: int) -> np.ndarray:
    """Decode, scale so the shorter side is `resize`, and return the centre `crop` x `crop` square."""
    from PIL import Image, UnidentifiedImageError

    _limit_png_text()
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=FORMATS)
        width, height = image.size
        check_shape(width, height, max_pixels)
        if image.format in ("JPEG", "MPO"):
            if data.count(b"\xff\xda") > MAX_JPEG_SCANS:  # SOS markers (an upper bound on scans)
                raise BadInput(f"JPEG has more than {MAX_JPEG_SCANS} scans", code="image_too_complex")
            # Decode at 1/2, 1/4 or 1/8 scale for free while the shorter side stays >= resize.
            image.draft("RGB", (resize, resize))
        with BUDGET.hold(image.width * image.height, DECODE_WAIT_S):
            image.load()  # the first frame or page only
            orientation = _orientation(image)
            image = _resizable(image)
            w, h = image.size
            side = min(w, h) * min(1.0, crop / resize)  # the crop, in decoded pixels
            box = ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)
            # reduce() first averages the box down by whole factors (not for 16 bits, which Pillow lacks).
            gap = None if image.mode in _SIXTEEN_BIT else 3.0
            out = image.resize((crop, crop), Image.Resampling.BILINEAR, box=box, reducing_gap=gap)
    except Image.DecompressionBombError:
        raise BadInput(f"image has more than {max_pixels} pixels", code="image_too_large") from None
    except UnidentifiedImageError:
        raise BadInput(f"not an image Pillow can read (accepted: {', '.join(FORMATS)})",
                       code="not_an_image") from None
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError, TypeError, ZeroDivisionError,
            struct.error) as exc:  # what Pillow's plugins raise on malformed files
        raise BadInput(f"image could not be decoded: {exc}", code="corrupt_image") from None
    if orientation != 1:
        out = out.transpose(getattr(Image.Transpose, _ORIENTATION[orientation]))
    return np.asarray(_eight_bit(out), dtype=np.uint8)

