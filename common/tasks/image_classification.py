"""Image classification: uint8 pixels in, top-k {label, index, probability} out."""

from __future__ import annotations

import functools
import io
import warnings
from pathlib import Path

import numpy as np

from common.errors import BadInput, UnsupportedMediaType

# -- web side ----------------------------------------------------------------


def parse(request, limits) -> tuple[list[bytes], bool]:
    """One image, as multipart field `file` or as a raw image/* body."""
    mimetype = request.mimetype or ""
    if mimetype == "multipart/form-data":
        upload = request.files.get("file")
        if upload is None:
            raise BadInput("multipart upload needs a field named 'file'", code="missing_file")
        data = upload.read()
    elif mimetype.startswith("image/") or mimetype == "application/octet-stream":
        data = request.get_data()
    else:
        raise UnsupportedMediaType(
            f"send an image as multipart field 'file' or as an image/* body, not {mimetype or 'no content type'}")
    if not data:
        raise BadInput("the image is empty", code="empty_input")
    return [data], True


def preprocess(item: bytes, spec, limits) -> dict[str, np.ndarray]:
    from PIL import Image, UnidentifiedImageError

    resize, crop = spec.config["preprocess"]["resize"], spec.config["preprocess"]["crop"]
    try:
        with warnings.catch_warnings():
            # Pillow warns between the limit and twice it; treat both as too large.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            Image.MAX_IMAGE_PIXELS = limits.max_image_pixels
            image = Image.open(io.BytesIO(item))
            if image.width * image.height > limits.max_image_pixels:
                raise Image.DecompressionBombError("too many pixels")
            # JPEG can decode at 1/2, 1/4, 1/8 scale for free: stay above the resize size.
            image.draft("RGB", (resize, resize))
            image = image.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise BadInput(f"image has more than {limits.max_image_pixels} pixels",
                       code="image_too_large") from None
    except UnidentifiedImageError:
        raise BadInput("not an image Pillow can read", code="not_an_image") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise BadInput(f"image could not be decoded: {exc}", code="corrupt_image") from None
    scale = resize / min(image.size)
    size = (max(crop, round(image.width * scale)), max(crop, round(image.height * scale)))
    image = image.resize(size, Image.BILINEAR, reducing_gap=3.0)
    left, top = (image.width - crop) // 2, (image.height - crop) // 2
    pixels = np.asarray(image.crop((left, top, left + crop, top + crop)), dtype=np.uint8)
    return {"pixels": pixels}


# -- worker side -------------------------------------------------------------


def check(inputs: dict[str, np.ndarray], spec) -> None:
    pixels = inputs.get("pixels")
    crop = spec.config["preprocess"]["crop"]
    if pixels is None or pixels.dtype != np.uint8 or pixels.shape != (crop, crop, 3):
        raise BadInput(f"expected uint8 pixels of shape ({crop}, {crop}, 3)", code="bad_input")


def collate(items: list[dict[str, np.ndarray]], spec) -> dict[str, np.ndarray]:
    return {"pixels": np.stack([item["pixels"] for item in items])}


@functools.lru_cache(maxsize=8)
def _labels(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text().splitlines())


def postprocess(row: dict[str, np.ndarray], spec) -> dict:
    labels = _labels(spec.file("labels"))
    probabilities = row["probabilities"]
    top = np.argsort(-probabilities)[: spec.config.get("top_k", 5)]
    return {"predictions": [
        {"label": labels[i], "index": int(i), "probability": float(probabilities[i])}
        for i in top
    ]}
