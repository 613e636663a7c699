"""JSON answers through orjson: numpy arrays serialised directly, floats in their shortest form.

Encoding a 384-float embedding with the standard json module was the largest
single cost of a text request in the web tier (docs/performance.md); orjson writes float32 arrays straight from
numpy, and shorter (float32 precision, not float64 digits).
"""

from __future__ import annotations

import orjson
from flask.json.provider import DefaultJSONProvider

OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


class OrjsonProvider(DefaultJSONProvider):
    def dumps(self, obj, **kwargs) -> str:
        return orjson.dumps(obj, default=self.default, option=OPTIONS).decode()

    def loads(self, s, **kwargs):
        return orjson.loads(s)

    def response(self, *args, **kwargs):
        obj = self._prepare_response_obj(args, kwargs)
        body = orjson.dumps(obj, default=self.default, option=OPTIONS)
        return self._app.response_class(body, mimetype=self.mimetype)  # type: ignore[arg-type]  # stub: str only
