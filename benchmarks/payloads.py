"""What the benchmark sends and what it accepts back: one sentence or the cat JPEG, per system."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass

TEXT, IMAGE = "text-embedding", "image-classifier"
MODELS = (TEXT, IMAGE)
SENTENCE = "A man is eating a piece of bread while the girl is carrying a baby."
CAT_CLASSES = range(281, 286)  # ImageNet's domestic cats; chelsea is 285 "Egyptian cat"
OPENAI_SHAPED = ("infinity", "ray")  # peers that take and answer OpenAI's embeddings shape
MANY_TEXTS = ("funnel", "funnel-one", *OPENAI_SHAPED)  # take several sentences a request


@dataclass
class Payload:
    body: bytes
    content_type: str
    kind: str  # what the body is, for the results file


def cat_jpeg() -> bytes:
    from PIL import Image
    from skimage import data

    out = io.BytesIO()
    Image.fromarray(data.chelsea()).save(out, format="JPEG", quality=90)
    return out.getvalue()


def multipart(field_name: str, filename: str, data: bytes, content_type: str) -> tuple[bytes, str]:
    boundary = "funnel-bench-boundary-7d1c"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field_name}\"; "
            f"filename=\"{filename}\"\r\nContent-Type: {content_type}\r\n\r\n").encode()
    body += data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def payload(model: str, system: str, jpeg: bytes, texts: int = 1) -> Payload:
    """What a request carries: one sentence or the cat; `texts` > 1, that many sentences (text only,
    to Funnel and the peers that take a list: MANY_TEXTS)."""
    words = len(SENTENCE.split())
    if model == TEXT and texts > 1:
        key = "input" if system in OPENAI_SHAPED else "texts"
        return Payload(json.dumps({"model": TEXT, key: [SENTENCE] * texts}).encode(), "application/json",
                       f"JSON {{\"{key}\": [...]}}, {texts} {words}-word sentences")
    if model == TEXT and system in OPENAI_SHAPED:
        return Payload(json.dumps({"model": TEXT, "input": SENTENCE}).encode(), "application/json",
                       f"JSON {{\"input\": ...}} (OpenAI's shape), one {words}-word sentence")
    if model == TEXT:
        return Payload(json.dumps({"text": SENTENCE}).encode(), "application/json",
                       f"JSON {{\"text\": ...}}, one {len(SENTENCE.split())}-word sentence")
    if system == "litserve":  # LitServe parses JSON or forms, not raw bodies
        body, content_type = multipart("file", "cat.jpg", jpeg, "image/jpeg")
        return Payload(body, content_type, f"multipart field 'file', {len(jpeg)} B JPEG")
    return Payload(jpeg, "image/jpeg", f"raw image/jpeg body, {len(jpeg)} B")


def check_answer(model: str, status: int, body: bytes) -> str | None:
    """None when the answer is right, else what is wrong with it."""
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}"
    try:
        answer = json.loads(body)
    except ValueError:
        return f"not JSON: {body[:200]!r}"
    if model == TEXT:
        first = (answer.get("data") or answer.get("results") or [answer])[0]
        vector = first.get("embedding")
        if not isinstance(vector, list) or len(vector) != 384:
            return f"no 384-d embedding: {str(answer)[:200]}"
        if abs(math.sqrt(sum(x * x for x in vector)) - 1) > 1e-3:
            return "embedding is not L2-normalised"
        return None
    predictions = answer.get("predictions") or [{}]
    if predictions[0].get("index") not in CAT_CLASSES:
        return f"first class is not a cat: {predictions[0]}"
    return None


def post(url: str, data: Payload, timeout: float = 60.0) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data.body, method="POST",
                                     headers={"Content-Type": data.content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
