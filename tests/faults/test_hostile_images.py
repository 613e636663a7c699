"""Hostile images sent at once to a live stack: each answered (200 or a 400 JSON), the web processes live on."""

from __future__ import annotations

import io
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from funnel.common.tasks.imaging import MAX_JPEG_SCANS
from funnel.scripts.stack import Stack
from tests.support import FAULT_TABLE, Outcome, http, wait_for

IMAGE = "image-classifier"
CATS = {"Egyptian cat", "tabby", "tiger cat"}


def png(mode: str, size: tuple[int, int], **save) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, 200).save(out, format="PNG", **save)
    return out.getvalue()


def hostile(cat_jpeg: bytes) -> dict[str, tuple[bytes, set[int]]]:
    """name -> (body, the statuses it may get)."""
    frames = [Image.new("P", (2000, 2000), i) for i in range(50)]
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:])
    cmyk = io.BytesIO()
    Image.new("CMYK", (3000, 2000), (10, 200, 30, 0)).save(cmyk, format="JPEG")
    junk = b"\xff\xda" * (MAX_JPEG_SCANS + 1)
    scans = cat_jpeg[:2] + b"\xff\xef" + (len(junk) + 2).to_bytes(2, "big") + junk + cat_jpeg[2:]
    return {
        **{f"40000x1 strip {i}": (png("L", (40000, 1)), {400}) for i in range(4)},
        "1x40000 strip": (png("RGB", (1, 40000)), {400}),
        **{f"36 Mpx RGBA in {len(png('RGBA', (6000, 6000))) // 1024} KB {i}": (png("RGBA", (6000, 6000)), {200})
           for i in range(3)},
        "36 Mpx 16-bit grey": (png("I;16", (6000, 6000)), {200}),
        "50-frame GIF": (gif.getvalue(), {200}),
        "CMYK JPEG": (cmyk.getvalue(), {200}),
        "too many JPEG scans": (scans, {400}),
        "1x1 PNG": (png("LA", (1, 1)), {200}),
        "41 Mpx over the limit": (png("L", (6400, 6400)), {400}),
    }


def web_pids(stack: Stack) -> set[int]:
    """The gunicorn processes under the web tier's master."""
    pids = set()
    for task in Path(f"/proc/{stack.web.pid}/task").iterdir():
        pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    # Two web processes whatever the cores (the default is one per two): both must live on.
    with Stack(model_store=model_store, models=[IMAGE], log_dir=tmp_path_factory.mktemp("hostile"),
               web_env={"FUNNEL_PROCESSES": "2"}) as running:
        yield running


def test_hostile_images_at_once_leave_the_web_processes_alive(stack, cat_jpeg):
    url = f"{stack.url}/v1/models/{IMAGE}/predict"
    # gunicorn forks its processes a moment apart: the first may answer before the second exists.
    before = wait_for(lambda: (pids := web_pids(stack)) and len(pids) >= 2 and pids, what="two web processes")
    cases = hostile(cat_jpeg)
    outcome = Outcome()

    def send(name):
        body, allowed = cases[name]
        started = time.monotonic()
        status, answer, headers = http("POST", url, body=body, headers={"Content-Type": "image/png"}, timeout=60)
        outcome.add(status, time.monotonic() - started)
        return name, status, answer, headers, allowed

    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(send, cases))
    FAULT_TABLE.append(("hostile images at once", outcome, 0))
    for name, status, answer, headers, allowed in results:
        assert status in allowed, (name, status, answer)
        assert headers["Content-Type"].startswith("application/json"), name
        if status == 400:
            assert answer["error"]["code"] in {"bad_image_shape", "image_too_large", "image_too_complex"}, answer
    assert outcome.slowest_s < 30, outcome
    assert web_pids(stack) == before  # nobody killed, nobody restarted
    status, answer, _ = http("POST", url, body=cat_jpeg, headers={"Content-Type": "image/jpeg"})
    assert status == 200 and answer["predictions"][0]["label"] in CATS


def test_an_upright_phone_photo_is_classified_like_the_original(stack, cat_jpeg):
    """The cat stored sideways with EXIF orientation 6 is still a cat."""
    sideways = Image.open(io.BytesIO(cat_jpeg)).transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    sideways.save(out, format="JPEG", exif=exif.tobytes(), quality=90)
    status, answer, _ = http("POST", f"{stack.url}/v1/models/{IMAGE}/predict", body=out.getvalue(),
                             headers={"Content-Type": "image/jpeg"})
    assert status == 200 and answer["predictions"][0]["label"] in CATS
    assert np.isfinite(answer["predictions"][0]["probability"])
