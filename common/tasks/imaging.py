"""Decoding an uploaded image into the model's square of uint8 RGB pixels (web side, Pillow only)."""

from __future__ import annotations

import io
import warnings

import numpy as np

from funnel.common.errors import BadInput


def center_crop(data: bytes, resize: int, crop: int, max_pixels: int) -> np.ndarray:
    """Decode, resize the shorter side to `resize`, and cut the centre `crop` x `crop` square."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow warns between the limit and twice it; treat both as too large.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            Image.MAX_IMAGE_PIXELS = max_pixels
            image: Image.Image = Image.open(io.BytesIO(data))
            if image.width * image.height > max_pixels:
                raise Image.DecompressionBombError("too many pixels")
            # JPEG can decode at 1/2, 1/4, 1/8 scale for free: stay above the resize size.
            image.draft("RGB", (resize, resize))
            image = image.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise BadInput(f"image has more than {max_pixels} pixels", code="image_too_large") from None
    except UnidentifiedImageError:
        raise BadInput("not an image Pillow can read", code="not_an_image") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise BadInput(f"image could not be decoded: {exc}", code="corrupt_image") from None
    scale = resize / min(image.size)
    size = (max(crop, round(image.width * scale)), max(crop, round(image.height * scale)))
    image = image.resize(size, Image.Resampling.BILINEAR, reducing_gap=3.0)
    left, top = (image.width - crop) // 2, (image.height - crop) // 2
    return np.asarray(image.crop((left, top, left + crop, top + crop)), dtype=np.uint8)
