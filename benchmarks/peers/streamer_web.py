"""service-streamer's RedisStreamer behind gunicorn: the web side.

    BENCH_MODEL=... BENCH_IMPL=... BENCH_REDIS=127.0.0.1:PORT \
        gunicorn -k gevent -w 2 -b 127.0.0.1:PORT benchmarks.peers.streamer_web:app

As service-streamer's README shows for several web processes: gevent workers,
one RedisStreamer each (created after the fork, so after gevent's patching),
the model in a separate process (streamer_worker.py). Preprocessing runs here,
as in Funnel's web tier; the model process collates, runs and postprocesses.
With BENCH_IMPL=eager, texts and JPEG bytes go to the model process raw, as
the documented examples send them: it tokenizes or decodes the batch itself.
"""

from __future__ import annotations

import os

from flask import Flask, jsonify, request
from service_streamer import RedisStreamer

from benchmarks.peers.common import TEXT_MODEL, env_config

config = env_config()
text = config["model"] == TEXT_MODEL
if config["impl"] == "eager":
    def preprocess(raw):
        return raw  # as the documented examples do: raw inputs, the model side does the rest
else:
    # Only the Task's preprocess runs here, never the backend.
    from funnel.common import tasks
    from funnel.common.store import load_spec

    task = tasks.load(load_spec(config["store"], config["model"]))
    preprocess = task.preprocess

streamer = RedisStreamer(redis_broker=os.environ["BENCH_REDIS"])
app = Flask(__name__)


@app.post("/predict")
def predict():
    raw = request.get_json()["text"] if text else request.get_data()
    return jsonify(streamer.predict([preprocess(raw)])[0])
