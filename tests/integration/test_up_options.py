"""`funnel up`'s batch size and linger reach the workers it starts: a real worker, started as
`funnel up` starts it, publishes the values it serves with in its registry hash."""

from __future__ import annotations

from funnel.common.contracts import registry
from funnel.scripts import stack
from funnel.scripts.redis_local import wait_until


def test_a_worker_funnel_up_starts_serves_with_the_batch_size_and_linger_given(
        redis_server, redis_client, keys, model_store):
    up = stack.build(["--model-store", str(model_store), "--batch-size", "text-embedding=3",
                      "--linger-ms", "1.5", "--no-front-door"],
                     environ={"FUNNEL_REDIS_URL": redis_server.url})
    try:
        worker = up.start_worker("text-embedding")

        def registered():
            return next((w for w in registry.live_workers(redis_client, keys) if w["pid"] == str(worker.pid)), None)

        published = wait_until(registered, 60, "the worker's registry hash", alive=worker)
        assert (published["model"], published["batch_size"], published["linger_ms"]) == ("text-embedding", "3", "1.5")
    finally:
        up.stop()
