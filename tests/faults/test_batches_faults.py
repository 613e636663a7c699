"""An OpenAI batch under a fault: a worker killed with SIGKILL mid-batch. The batch, driven by
OpenAI's own client, completes with every custom_id answered once and each answer the model's."""

from __future__ import annotations

import io
import json
import signal

import numpy as np
import openai
import redis

from funnel.common.bulk.batch_store import BATCH_PREFIX
from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from tests.support import FAST_HEARTBEAT, TEXT, freeze_holding_jobs, wait_for


def test_a_worker_killed_mid_batch_loses_and_repeats_nothing(model_store, tmp_path, expected_embeddings):
    texts = [f"batch crash line {i}: {'lorem ipsum ' * (i % 6)}dolor {i}" for i in range(600)]
    lines = "\n".join(json.dumps({"custom_id": f"k{i}", "method": "POST", "url": "/v1/embeddings",
                                  "body": {"model": TEXT, "input": text}}) for i, text in enumerate(texts))
    with Stack(model_store=model_store, models=[TEXT], workers=[], log_dir=tmp_path,
               worker_env={**FAST_HEARTBEAT, "FUNNEL_BATCH_SIZE": "8"}) as stack:
        victim = stack.start_worker(TEXT, FUNNEL_WORKER_ID="victim")
        stack.start_worker(TEXT, FUNNEL_WORKER_ID="survivor")
        stack.wait_ready(60, expected={TEXT: 2})
        client = redis.Redis.from_url(stack.redis_url)
        with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="none", max_retries=0) as sdk:
            uploaded = sdk.files.create(file=("crash.jsonl", io.BytesIO(lines.encode())), purpose="batch")
            batch = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
            wait_for(lambda: sdk.batches.retrieve(batch.id).request_counts.completed >= 100, timeout_s=60,
                     what="batch under way")
            held = freeze_holding_jobs(client, victim, "victim")
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            done = wait_for(lambda: (lambda b: b if b.status == "completed" else None)(sdk.batches.retrieve(batch.id)),
                            timeout_s=180, interval_s=0.2, what="batch completed after the crash")
            output = [json.loads(x) for x in sdk.files.content(done.output_file_id).text.splitlines()]
        job_id = batch.id.removeprefix(BATCH_PREFIX)
        duplicates = client.hget(Keys().job(job_id), "duplicates")
        recovered = int(client.hget(f"funnel:worker:{{{TEXT}}}:survivor", "recovered") or 0)
    assert held > 0 and recovered >= held
    assert done.request_counts.completed == len(texts) and done.request_counts.failed == 0
    assert done.error_file_id is None and duplicates == b"0"
    assert sorted(o["custom_id"] for o in output) == sorted(f"k{i}" for i in range(len(texts)))  # each once
    expected = expected_embeddings(texts[::97])
    by_id = {o["custom_id"]: o["response"]["body"]["data"][0]["embedding"] for o in output}
    for i in range(0, len(texts), 97):
        assert np.allclose(by_id[f"k{i}"], expected[texts[i]], atol=1e-4), i
