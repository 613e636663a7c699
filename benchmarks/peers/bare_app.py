"""The floor of a Flask web tier: parse the JSON body, answer a constant embedding.

    gunicorn -k gthread --threads 64 -w 2 -b 127.0.0.1:PORT benchmarks.peers.bare_app:app

benchmarks/web_cpu.py runs it under the same gunicorn settings as Funnel's web
tier, so the difference in CPU per request is Funnel's own work and waiting.
"""

from __future__ import annotations

import orjson
from flask import Flask, Response, request

app = Flask(__name__)
ANSWER = orjson.dumps({"model": "text-embedding", "embedding": [0.05] * 384})


@app.post("/v1/models/<name>/predict")
def predict(name: str):
    if not isinstance(request.get_json().get("text"), str):
        return Response(b'{"error": "text"}', status=400, mimetype="application/json")
    return Response(ANSWER, mimetype="application/json")
