"""Both tiers killed (`kill -9`) and restarted under gRPC load: every call answered, correctly, once.

The load is tritonclient[grpc]'s, one client per thread, each text a call of its own. A worker
killed mid-batch is recovered as on HTTP (its in-flight jobs go back to the queue); a gRPC process
killed drops its connections, and its callers, told UNAVAILABLE (the status gRPC clients retry),
call again until the restarted process answers. What a killed process had queued is still run,
and its replies expire unread in the dead process's inbox: that is the only cost. A process told
to stop (SIGTERM) answers what it holds first, so that nothing is run twice: no reply is left unread;
every call it does not answer is told UNAVAILABLE, never CANCELLED.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import redis
import tritonclient.grpc as grpcclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from funnel.common.contracts.keys import Keys
from funnel.common.link.connection import scan_keys
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from tests.support import FAST_HEARTBEAT, TEXT, Outcome, assert_each_answered_once, freeze_holding_jobs, texts, wait_for

RETRY_S = 0.2
RETRIES = 150  # times RETRY_S: how long a caller keeps calling before the call counts as failed
# What a general gRPC client calls again: UNAVAILABLE (refused, or the connection lost). Any other
# status, CANCELLED included, counts as the call failed.
RETRIED = ("StatusCode.UNAVAILABLE",)


def grpc_stack(model_store, tmp_path) -> Stack:
    return Stack(model_store=model_store, models=[TEXT], workers=[], grpc_port=free_port(), log_dir=tmp_path,
                 worker_env={**FAST_HEARTBEAT, "FUNNEL_LINGER_MS": "20", "FUNNEL_BATCH_SIZE": "8"})


def send_over_grpc(stack: Stack, batch: list[str], expected: dict, outcome: Outcome, clients: int,
                   progress: threading.Semaphore, retried: list[int]) -> None:
    """One call per text from `clients` threads, each with its own channel; RETRIED statuses retried."""
    local = threading.local()

    def one(text: str) -> None:
        if not hasattr(local, "client"):
            local.client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
        tensor = grpcclient.InferInput("TEXT", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
        started = time.monotonic()
        for attempt in range(RETRIES):
            try:
                embedding = local.client.infer(TEXT, [tensor], client_timeout=60).as_numpy("embedding")[0]
            except InferenceServerException as exc:
                if exc.status() in RETRIED and attempt + 1 < RETRIES:
                    retried.append(1)
                    time.sleep(RETRY_S)
                    continue
                outcome.add(503 if exc.status() in RETRIED else 500, time.monotonic() - started)
            else:
                outcome.add(200, time.monotonic() - started, np.allclose(embedding, expected[text], atol=1e-4))
            break
        progress.release()

    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(one, batch))


class Load:
    """send_over_grpc on a thread while the block runs; joined (bounded) on the way out."""

    def __init__(self, stack: Stack, batch: list[str], expected: dict, clients: int = 16):
        self.outcome, self.progress, self.retried = Outcome(), threading.Semaphore(0), []
        self.thread = threading.Thread(target=send_over_grpc, args=(stack, batch, expected, self.outcome, clients,
                                                                    self.progress, self.retried))

    def answered(self, n: int) -> None:
        for _ in range(n):
            assert self.progress.acquire(timeout=60), "the load stalled"

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(timeout=180)
        assert not self.thread.is_alive(), "the load did not finish in time"


def queued_or_held(client: redis.Redis) -> int:
    """Jobs in the text model's queue, or taken by a worker and not yet answered."""
    return client.llen(Keys().queue(TEXT)) + sum(client.llen(key) for key in scan_keys(client, "funnel:inflight:*"))


def unread_replies(client: redis.Redis) -> int:
    return sum(client.llen(key) for key in scan_keys(client, "funnel:reply:*"))


def test_worker_killed_and_restarted_under_grpc_load(model_store, tmp_path, expected_embeddings, report):
    batch = texts(300, "grpc-worker-kill")
    expected = expected_embeddings(batch)
    with grpc_stack(model_store, tmp_path) as stack:
        victim = stack.start_worker(TEXT, FUNNEL_WORKER_ID="victim")
        stack.wait_ready(60, expected={TEXT: 1})
        client = redis.Redis.from_url(stack.redis_url)
        with Load(stack, batch, expected) as load:
            load.answered(60)  # a fifth answered: kill in the middle
            held = freeze_holding_jobs(client, victim, "victim")
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            stack.start_worker(TEXT, FUNNEL_WORKER_ID="victim")  # the same id claims its in-flight jobs
        stray = unread_replies(client)
    report(load.outcome, stray)
    assert held > 0
    assert_each_answered_once(load.outcome, len(batch), stray)


def test_grpc_process_killed_and_restarted_under_load(model_store, tmp_path, expected_embeddings, report):
    batch = texts(300, "grpc-process-kill")
    expected = expected_embeddings(batch)
    with grpc_stack(model_store, tmp_path) as stack:
        stack.start_worker(TEXT)
        stack.wait_ready(60, expected={TEXT: 1})
        client = redis.Redis.from_url(stack.redis_url)
        with Load(stack, batch, expected) as load:
            load.answered(60)
            stack.grpc.send_signal(signal.SIGKILL)
            stack.grpc.wait()
            wait_for(lambda: load.retried, what="a caller refused while the process is down")
            stack.start_grpc()
            stack.wait_grpc()
        # The killed process's calls were run and answered into its inbox, which nobody reads now;
        # they expire there. Every caller still has its one answer, from the restarted process.
        wait_for(lambda: client.llen(Keys().queue(TEXT)) == 0, what="the queue drained")
    report(load.outcome, 0)
    assert_each_answered_once(load.outcome, len(batch), 0)
    assert load.retried, "no call was refused while the process was down: the kill came too late"


def test_grpc_process_sigterm_answers_the_calls_in_flight(model_store, tmp_path, expected_embeddings, report):
    """SIGTERM: the process stops taking calls, answers those it holds, and exits 0."""
    batch = texts(300, "grpc-process-term")
    expected = expected_embeddings(batch)
    with grpc_stack(model_store, tmp_path) as stack:
        stack.start_worker(TEXT)
        stack.wait_ready(60, expected={TEXT: 1})
        client = redis.Redis.from_url(stack.redis_url)
        with Load(stack, batch, expected) as load:
            load.answered(60)
            stack.grpc.send_signal(signal.SIGTERM)
            assert stack.grpc.wait(timeout=30) == 0
            stack.start_grpc()
            stack.wait_grpc()
        stray = unread_replies(client)
    report(load.outcome, stray)
    assert_each_answered_once(load.outcome, len(batch), stray)



def test_a_stream_open_at_sigterm_has_its_accepted_requests_answered(model_store, tmp_path, expected_embeddings):
    """A stream's requests queued when SIGTERM comes are answered on it before the process closes the
    stream (UNAVAILABLE, the status a client retries); none is left answered into Redis unread."""
    batch = texts(24, "grpc-stream-term")
    expected = expected_embeddings(batch)
    with grpc_stack(model_store, tmp_path) as stack:
        worker = stack.start_worker(TEXT)
        stack.wait_ready(60, expected={TEXT: 1})
        client = redis.Redis.from_url(stack.redis_url)
        answers: list = []
        arrived = threading.Condition()

        def on_answer(result, error) -> None:
            with arrived:
                answers.append((result, error))
                arrived.notify_all()

        caller = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
        caller.start_stream(callback=on_answer)
        worker.send_signal(signal.SIGSTOP)  # the requests wait in the queue while the process stops
        try:
            for i, text in enumerate(batch):
                tensor = grpcclient.InferInput("TEXT", [1], "BYTES")
                tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
                caller.async_stream_infer(TEXT, [tensor], request_id=str(i))
            wait_for(lambda: queued_or_held(client) == len(batch), what="every request queued")
            stack.grpc.send_signal(signal.SIGTERM)
        finally:
            worker.send_signal(signal.SIGCONT)
        assert stack.grpc.wait(timeout=30) == 0
        with arrived:  # each answer, then the stream's end
            assert arrived.wait_for(lambda: len(answers) > len(batch), timeout=30), answers
        caller.stop_stream()
        caller.close()
        stray = unread_replies(client)
    results = [result for result, error in answers if error is None]
    assert sorted(r.get_response().id for r in results) == [str(i) for i in sorted(range(len(batch)), key=str)]
    for result in results:
        text = batch[int(result.get_response().id)]
        assert np.allclose(result.as_numpy("embedding")[0], expected[text], atol=1e-4)
    # The stream's end is the process's own refusal, its status sent before the connection closed.
    ended = [error for _, error in answers if error is not None]
    assert [e.status() for e in ended] == ["StatusCode.UNAVAILABLE"] and "stopping" in ended[0].message(), ended
    assert stray == 0
