"""LitServe with batching: max_batch_size 32, batch_timeout 0.02 s.

    BENCH_MODEL=... BENCH_IMPL=... python -m benchmarks.peers.litserve_app PORT

Run from the repository root, like every peer. LitServe's defaults otherwise: one
inference worker (accelerator cpu, or cuda with one device when BENCH_DEVICE is a
GPU), one API server process unless BENCH_WEB_PROCESSES sets num_api_servers.
decode_request (the preprocessing) runs in the inference worker, as LitServe does
it. Text: JSON {"text": ...}; image: multipart field "file" (LitServe parses JSON
or forms, not raw image bodies).
"""

from __future__ import annotations

import sys

import litserve as ls

from benchmarks.peers.common import TEXT_MODEL, env_config, load_model, write_pidfile

CONFIG = env_config()
TEXT = CONFIG["model"] == TEXT_MODEL


class BenchAPI(ls.LitAPI):
    def setup(self, device):
        self.model = load_model()  # on BENCH_DEVICE, whatever LitServe names
        write_pidfile()

    def decode_request(self, request):
        return self.model.preprocess(request["text"] if TEXT else request["file"].file.read())

    def batch(self, inputs):
        return list(inputs)  # token ids differ in length; the model collates

    def predict(self, batch):
        return self.model.predict(batch)

    def unbatch(self, output):
        return output

    def encode_response(self, output):
        return output


if __name__ == "__main__":
    accelerator = "cpu" if CONFIG["device"] == "cpu" else "cuda"
    server = ls.LitServer(BenchAPI(max_batch_size=32, batch_timeout=0.02), accelerator=accelerator, devices=1)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), generate_client_file=False, log_level="warning",
               num_api_servers=CONFIG["web_processes"] or None)
