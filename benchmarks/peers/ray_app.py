"""Ray Serve with @serve.batch (max_batch_size 32, batch_wait_timeout_s 0.02), one replica, as Ray's
docs batch a model: the MiniLM weights through sentence-transformers, in PyTorch.

    .venv-peers/bin/python benchmarks/peers/ray_app.py PORT MODEL_DIR PIDFILE

Run with the peers' own environment (benchmarks/install.sh: Ray pins what Funnel cannot share), as a
script: it imports nothing of Funnel's. A local Ray with no dashboard, usage statistics off, its
HTTP proxy on 127.0.0.1. Takes and answers OpenAI's embeddings shape, {"input": ...} ->
{"data": [{"embedding": [...]}]}.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import ray  # noqa: E402
from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402


@serve.deployment(num_replicas=1)
class Embedder:
    def __init__(self, model_dir: str, pidfile: str):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_dir, device="cpu")
        with open(pidfile, "w") as out:
            out.write(str(os.getpid()))

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.02)
    async def embed(self, texts: list[str]) -> list[list[float]]:
        return self.model.encode(texts, batch_size=32, normalize_embeddings=True).tolist()

    async def __call__(self, request: Request) -> dict:
        given = (await request.json())["input"]
        texts = [given] if isinstance(given, str) else given
        vectors = await asyncio.gather(*(self.embed(text) for text in texts))  # @serve.batch gathers them
        return {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v}
                                           for i, v in enumerate(vectors)]}


if __name__ == "__main__":
    port, model_dir, pidfile = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=os.cpu_count(), log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Embedder.bind(model_dir, pidfile), route_prefix="/embeddings")
    while True:
        time.sleep(3600)
