"""POST /v1/embeddings: OpenAI's embeddings API, for every served model whose output is an embedding.

    {"model": "text-embedding", "input": "a sentence" | ["one", "two"],
     "encoding_format": "float" | "base64", "dimensions": <the model's own>, "user": <ignored>}
    -> {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [...] | "<base64>"}],
        "model": "text-embedding", "usage": {"prompt_tokens": n, "total_tokens": n}}

The model is named in the body, not the path (`model_of`, which the front
calls once the body is read). The items are /v1's texts and take the same
pipeline; usage counts the token ids the web tier's tokenizer made of them.
Token ids as input are refused with a 400: an OpenAI client tokenizes with
OpenAI's vocabulary (tiktoken), whose ids would name other words in this
model's, and embedding the wrong text without a word is worse than a refusal.
`dimensions` is accepted only as the model's own size: these models cannot
shorten their vectors. Errors are OpenAI's {"error": {"message", "type",
"param", "code"}} with the status OpenAI gives (404 for an unknown model).
"""

from __future__ import annotations

import base64
import logging
import re
from typing import Any

import numpy as np
import orjson
from werkzeug.wrappers import Request

from funnel.common.errors import BadInput, FunnelError, NotFound, UnsupportedMediaType
from funnel.common.tasks import Task
from funnel.web import errors
from funnel.web.jsonio import OPTIONS
from funnel.web.pipeline import Answered, Rendered, Work

log = logging.getLogger("funnel.web")

PATH = re.compile(r"/v1/embeddings")
FORMATS = ("float", "base64")
TOKEN_IDS_REFUSED = ("token ids are not accepted: send the text itself, which this server tokenizes with the "
                     "model's own vocabulary (ids from an OpenAI tokenizer would name other words); LangChain: "
                     "OpenAIEmbeddings(check_embedding_ctx_length=False)")


class BadParam(BadInput):
    """A 400 that names the request field at fault, as OpenAI's `param` does."""

    def __init__(self, *, param: str, message: str, code: str = "invalid_value"):
        super().__init__(message, code=code)
        self.param = param


def is_token_ids(value: Any) -> bool:
    """A list of integers: what OpenAI's API takes as one input's tokens."""
    return isinstance(value, list) and bool(value) and all(isinstance(i, int) and not isinstance(i, bool)
                                                          for i in value)


def is_embedding_model(task: Task) -> bool:
    """A model this route serves: text in, an "embedding" output."""
    return task.input_kind == "text" and "embedding" in task.output_shapes()


class OpenAIEmbeddings:
    def __init__(self, max_items: int):
        self.max_items = max_items

    def model_of(self, request: Request) -> str:
        """The model the body names: the front resolves it as it would a name from the path."""
        model = self._body(request).get("model")
        if not isinstance(model, str) or not model:
            raise BadParam(param="model", message="'model' must name a served model (GET /v1/models lists them)")
        return model

    def parse(self, task: Task, request: Request) -> Work[str]:
        return self.read(task, self._body(request))

    def read(self, task: Task, body: dict) -> Work[str]:
        """A request body's texts, and how to write their vectors (the context): a request's, or a
        batch line's (protocols/openai_batch.py)."""
        if not is_embedding_model(task):
            raise BadParam(param="model", message=f"{task.spec.name} does not give embeddings; GET /v1/models "
                           "lists those that do", code="model_not_supported")
        encoding = body.get("encoding_format", "float")
        if encoding not in FORMATS:
            raise BadParam(param="encoding_format", message=f"encoding_format must be one of {', '.join(FORMATS)}")
        dimensions = body.get("dimensions")
        dim = task.output_shapes()["embedding"][0]
        if dimensions is not None and dimensions != dim:
            raise BadParam(param="dimensions",
                           message=f"{task.spec.name} gives {dim} dimensions only; leave 'dimensions' out")
        return Work(self._texts(body.get("input")), encoding)  # kept: how to write the vectors

    def _texts(self, given: Any) -> list[str]:
        texts = [given] if isinstance(given, str) else given
        if not isinstance(texts, list) or not texts:
            raise BadParam(param="input", message="'input' must be a string or a non-empty list of strings")
        if all(is_token_ids(t) for t in texts) or is_token_ids(texts):
            raise BadParam(param="input", message=TOKEN_IDS_REFUSED, code="token_ids_not_supported")
        if not all(isinstance(t, str) for t in texts):
            raise BadParam(param="input", message="'input' must be a string or a list of strings")
        if len(texts) > self.max_items:
            raise BadParam(param="input", message=f"{len(texts)} inputs in one request; the limit is {self.max_items}",
                           code="too_many_items")
        return texts

    @staticmethod
    def _body(request: Request) -> dict:
        if request.mimetype != "application/json":
            raise UnsupportedMediaType(f"send JSON as application/json, not {request.mimetype or 'no content type'}")
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise BadInput("the body must be a JSON object", code="bad_json")
        return body

    def render(self, task: Task, work: Work[str], answered: Answered) -> tuple[bytes, list[tuple[str, str]]]:
        body = answer(task.spec.name, [(reply.outputs or {})["embedding"] for reply in answered.replies],
                      work.kept == "base64", tokens_of(answered.prepared))
        return orjson.dumps(body, option=OPTIONS), []

    def render_error(self, error: Exception, request: Request) -> Rendered:
        """OpenAI's error shape, with /v1's status and headers (Retry-After on a 503)."""
        if not errors.expected(error):
            log.exception("embeddings failed", exc_info=error)
        status, body, headers = errors.render(error, request)
        code, message = body["error"]["code"], body["error"]["message"]
        param = getattr(error, "param", None)
        if isinstance(error, NotFound) and error.code == "unknown_model":  # a batch's or file's keeps its own
            code, param = "model_not_found", "model"
        if param is None and isinstance(error, FunnelError) and error.status == 400 and code != "bad_json":
            param = "input"  # the task's refusals (empty, too long) are of the texts
        return status, orjson.dumps(error_body(status, code, message, param)), headers


def tokens_of(prepared: list) -> int:
    """The token ids the web tier's tokenizer made of these items: an answer's usage."""
    return sum(int(np.size(item.get("input_ids", ()))) for item in prepared)


def answer(model: str, vectors: list, as_base64: bool, tokens: int) -> dict:
    """The embeddings API's answer: each vector as floats or base64 (little-endian float32)."""
    data = []
    for i, vector in enumerate(vectors):
        vector = np.asarray(vector, dtype="<f4")
        embedding: Any = base64.b64encode(vector.tobytes()).decode() if as_base64 else vector
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def error_body(status: int, code: str, message: str, param: str | None) -> dict:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_type(status: int) -> str:
    """OpenAI's error types, by status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status < 500:
        return "invalid_request_error"
    return "server_error"
