"""Plain Flask calling the model once per request, no batching.

    BENCH_MODEL=... BENCH_IMPL=... BENCH_THREADS=1 \
        gunicorn -w 2 -b 127.0.0.1:PORT benchmarks.peers.flask_app:app

Each gunicorn worker (default sync worker class) loads its own model after the fork.
Text: JSON {"text": ...}; image: the JPEG as a raw image/* body.
"""

from __future__ import annotations

from flask import Flask, jsonify, request

from benchmarks.peers.common import TEXT_MODEL, env_config, load_model, write_pidfile

config = env_config()
model = load_model()
write_pidfile()
app = Flask(__name__)


@app.post("/predict")
def predict():
    raw = request.get_json()["text"] if config["model"] == TEXT_MODEL else request.get_data()
    return jsonify(model.predict([model.preprocess(raw)])[0])
