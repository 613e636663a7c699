"""service-streamer's model worker: batches from Redis, one model process.

    BENCH_MODEL=... BENCH_IMPL=... BENCH_REDIS=127.0.0.1:PORT python -m benchmarks.peers.streamer_worker

Run from the repository root, like every peer. run_redis_workers_forever spawns
the model process (multiprocessing "spawn") and waits on it; batch 32, max
latency 20 ms, one worker.
"""

from __future__ import annotations

import os

from service_streamer import ManagedModel, run_redis_workers_forever

from benchmarks.peers.common import env_config, load_model, write_pidfile

BATCH_SIZE = int(os.environ.get("BENCH_BATCH_SIZE", "32"))
MAX_LATENCY_S = float(os.environ.get("BENCH_MAX_LATENCY_S", "0.02"))


class BenchModel(ManagedModel):
    def init_model(self):
        self.model = load_model()
        self.raw_inputs = env_config()["impl"] == "eager"  # the web sent raw texts / JPEG bytes
        write_pidfile()

    def predict(self, batch):
        if self.raw_inputs:
            batch = [self.model.preprocess(raw) for raw in batch]
        return self.model.predict(batch)


if __name__ == "__main__":
    run_redis_workers_forever(BenchModel, BATCH_SIZE, MAX_LATENCY_S, worker_num=1,
                              redis_broker=os.environ["BENCH_REDIS"])
