"""RapidOCR() in plain Flask: the page read in the web process that received it, as the package's README
serves it.

    gunicorn -w 2 -b 127.0.0.1:PORT benchmarks.peers.rapidocr_flask:app

Each gunicorn worker builds its own RapidOCR() after the fork (the package's defaults: ONNX Runtime's
default threads). The page is the raw image/* body; the answer is the lines, as Funnel's ocr answers them.
"""

from __future__ import annotations

from flask import Flask, jsonify, request
from rapidocr_onnxruntime import RapidOCR

engine = RapidOCR()
app = Flask(__name__)


@app.post("/ocr")
def ocr():
    found, _ = engine(request.get_data())
    lines = [{"box": box, "text": text, "confidence": float(score)} for box, text, score in found or []]
    return jsonify({"lines": lines})
