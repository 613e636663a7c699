"""Ray Serve with @serve.batch (max_batch_size 32, batch_wait_timeout_s 0.02), one replica, as Ray's
docs batch a model: the MiniLM weights through sentence-transformers, in PyTorch.

    .venv-peers/bin/python benchmarks/peers/ray_app.py PORT MODEL_DIR PIDFILE

Run with the peers' own environment (benchmarks/install.sh: Ray pins what Funnel cannot share), as a
script: it imports nothing of Funnel's. A local Ray with no dashboard, usage statistics off, its
HTTP proxy on 127.0.0.1. Takes and answers OpenAI's embeddings shape, {"input": ...} ->
{"data": [{"embedding": [...]}]}.

Deployed as Ray's docs tune a batching replica on a CPU host ("Dynamic Request Batching", "Performance
Tuning", "Configuring parallelism with OMP_NUM_THREADS"): max_ongoing_requests above any client count,
and num_cpus, which Ray also turns into the replica's OMP_NUM_THREADS, below the host's cores.
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

MAX_BATCH_SIZE = 32  # as the other batching peers
BATCH_WAIT_TIMEOUT_S = 0.02  # LitServe's and service-streamer's window
# Ray's default (5) is below the batch: the replica never batched more than 5 and turned the rest away,
# and the proxy retried them after backoffs of up to 0.5 s (9 req/s at 32 clients, p50 2.4 s; Ray warns
# of it, ray-project/ray#43288). Its docs ask for at least max_batch_size, and for far more on an async
# replica (their example: 1000): above every client count here, so that requests wait in @serve.batch's
# queue, never in the proxy's backoff, which loses throughput as clients outnumber it (ray-project/ray#52609).
MAX_ONGOING_REQUESTS = 1000
# Ray sets the replica's OMP_NUM_THREADS to its num_cpus: every core but one, which the HTTP proxy and
# Ray's own processes need (on 2 cores, torch on two threads served 1.4-3.5x fewer requests/s than one).
REPLICA_CPUS = max(1, (os.cpu_count() or 1) - 1)


@serve.deployment(num_replicas=1, max_ongoing_requests=MAX_ONGOING_REQUESTS,
                  ray_actor_options={"num_cpus": REPLICA_CPUS})
class Embedder:
    def __init__(self, model_dir: str, pidfile: str):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_dir, device="cpu")
        with open(pidfile, "w") as out:
            out.write(str(os.getpid()))

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_TIMEOUT_S)
    async def embed(self, texts: list[str]) -> list[list[float]]:
        return self.model.encode(texts, batch_size=MAX_BATCH_SIZE, normalize_embeddings=True).tolist()

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
