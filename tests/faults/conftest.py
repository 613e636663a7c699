"""Fault tests: real redis-server, real web and worker processes, bounded load on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import redis

from funnel.common import tasks
from funnel.common.connection import scan_keys
from funnel.common.keys import Keys
from funnel.common.store import load_spec
from funnel.scripts.stack import Stack
from tests import toy_model
from tests.conftest import http, metric

TEXT = "text-embedding"
FAST_HEARTBEAT = {"FUNNEL_HEARTBEAT_TTL_S": "2"}
# tests/third_party/toyscore's PacedScore: its workers and web tier need PACED_ENV to import it.
PACED = "paced-score"
PACE_S = 1.5
PACED_ENV = {"PYTHONPATH": str(toy_model.PACKAGE_DIR)}


@dataclass
class Outcome:
    """What a run of requests came to: the closing note's fault table is made of these."""

    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    wrong: int = 0  # answered 200 with somebody else's result
    slowest_s: float = 0.0

    def add(self, status: int, seconds: float, correct: bool = True) -> None:
        self.sent += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.wrong += status == 200 and not correct
        self.slowest_s = max(self.slowest_s, seconds)

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)


def texts(n: int, tag: str) -> list[str]:
    return [f"{tag} request {i}: {'the quick brown fox ' * (i % 5)}jumps" for i in range(n)]


@pytest.fixture(scope="session")
def expected_embeddings(model_store):
    """Reference embeddings computed in-process, to catch any mixed-up answer."""
    from funnel.worker.backend import load

    spec = load_spec(model_store, TEXT)
    model, task = load(spec, "onnx", "cpu"), tasks.load(spec)

    def embed(batch: list[str]) -> dict[str, np.ndarray]:
        out = {}
        for text in batch:
            out[text] = model.run(task.collate([task.preprocess(text)]))["embedding"][0]
        return out

    return embed


def send_texts(stack: Stack, batch: list[str], expected: dict, outcome: Outcome,
               clients: int = 16, progress: threading.Semaphore | None = None) -> None:
    """POST each text to the text model, checking each 200's embedding against expected[text]."""
    send(stack, TEXT, batch, lambda text: {"text": text},
         lambda text, body: np.allclose(body["embedding"], expected[text], atol=1e-4),
         outcome, clients, progress)


def send_vectors(stack: Stack, batch: list[list[float]], expected: dict, outcome: Outcome,
                 clients: int = 16, progress: threading.Semaphore | None = None) -> None:
    """POST each vector to the paced toy scorer (PACED), checking each 200's scores against
    expected[tuple(vector)] (paced_expected)."""
    send(stack, PACED, batch, lambda vector: {"input": vector},
         lambda vector, body: np.allclose(body["scores"], expected[tuple(vector)], atol=1e-5),
         outcome, clients, progress)


def send(stack: Stack, model: str, batch: list, body: Callable[[Any], dict], correct: Callable[[Any, dict], bool],
         outcome: Outcome, clients: int, progress: threading.Semaphore | None) -> None:
    """POST one request per item of batch from `clients` threads, adding each to outcome."""
    url = f"{stack.url}/v1/models/{model}/predict"

    def one(item) -> None:
        started = time.monotonic()
        status, answer, _ = http("POST", url, json_body=body(item), timeout=60)
        ok = status != 200 or correct(item, answer)
        outcome.add(status, time.monotonic() - started, ok)
        if progress:
            progress.release()

    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(one, batch))


def paced_expected(batch: list[list[float]]) -> dict[tuple[float, ...], np.ndarray]:
    """The toy scorer's answer to each vector, computed with numpy."""
    return dict(zip(map(tuple, batch), toy_model.expected_scores(np.array(batch))))


@pytest.fixture(scope="session")
def paced_store(tmp_path_factory):
    """A store holding PACED: the toy scorer whose every batch takes PACE_S (and batches of up to 64),
    so that a worker holds the jobs it took that long, on any machine."""
    store = tmp_path_factory.mktemp("paced-store")
    toy_model.add_paced(store, tmp_path_factory.mktemp("paced"), PACED, batch_s=PACE_S, batch_size=64)
    return store


@contextlib.contextmanager
def load_running(stack: Stack, batch: list, expected: dict, clients: int,
                 outcome: Outcome | None = None, progress: threading.Semaphore | None = None,
                 timeout_s: float = 120, sender=send_texts):
    """sender (send_texts, send_vectors) in a background thread while the block runs; joined
    (bounded) on the way out."""
    outcome = outcome or Outcome()
    thread = threading.Thread(target=sender, args=(stack, batch, expected, outcome, clients, progress))
    thread.start()
    try:
        yield outcome
    finally:
        thread.join(timeout=timeout_s)
    assert not thread.is_alive(), "the load did not finish in time"


def assert_each_answered_once(outcome: Outcome, sent: int, stray: int) -> None:
    assert outcome.ok == sent == outcome.sent, outcome
    assert outcome.wrong == 0 and stray == 0


def stray_replies(client: redis.Redis, stack: Stack) -> int:
    """Replies nobody read: a job answered twice leaves its second reply in a reply list, or the
    web tier's inbox finds nobody waiting for it (counted in funnel_replies_unclaimed_total)."""
    scraped = http("GET", f"{stack.url}/metrics")[1]["_text"]
    return len(list(scan_keys(client, "funnel:reply:*"))) + int(metric(scraped, "funnel_replies_unclaimed_total"))


def freeze_holding_jobs(client: redis.Redis, proc, worker_id: str, timeout_s: float = 30, model: str = TEXT) -> int:
    """SIGSTOP the worker at a moment it holds jobs; returns how many it holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        os.kill(proc.pid, signal.SIGSTOP)
        held = client.llen(Keys().inflight(model, worker_id))
        if held:
            return held
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.005)
    raise TimeoutError(f"worker {worker_id} never held a job")


def wait_for(condition, timeout_s: float = 30, interval_s: float = 0.05, what: str = "condition",
             check=None, detail=None):
    """condition()'s first true value, polled; check() runs each time (it raises when waiting is
    pointless, e.g. a process exited); detail() adds context (logs) to the timeout's message."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}"
                               + (f"\n{detail()}" if detail is not None else ""))
        time.sleep(interval_s)


FAULT_TABLE: list[tuple[str, Outcome, int]] = []


@pytest.fixture()
def report(request):
    """Record a fault's outcome for the summary table printed at the end of the run."""
    def record(outcome: Outcome, stray: int) -> None:
        FAULT_TABLE.append((request.node.name, outcome, stray))
    return record


def pytest_terminal_summary(terminalreporter):
    if not FAULT_TABLE:
        return
    write = terminalreporter.write_line
    write("")
    write("| fault | sent | succeeded | failed (status: count) | answered twice | lost | wrong answer |")
    write("|---|---|---|---|---|---|---|")
    for name, o, stray in FAULT_TABLE:
        failed = ", ".join(f"{s}: {n}" for s, n in sorted(o.statuses.items()) if s != 200) or "none"
        lost = o.sent - sum(o.statuses.values())
        write(f"| {name} | {o.sent} | {o.ok} | {failed} | {stray} | {lost} | {o.wrong} |")


@contextlib.contextmanager
def one_paced_worker(tmp_path_factory, model: str, web_env: dict[str, str], **stack: Any) -> Iterator[Stack]:
    """A stack of one worker of the toy scorer paced at 50 ms a batch of one (a few dozen requests
    saturate it on any machine), its web tier with these settings, no deadline shedding."""
    store = tmp_path_factory.mktemp(f"{model}-store")
    toy_model.add_paced(store, tmp_path_factory.mktemp("paced"), model, 0.05, batch_size=1)
    with Stack(model_store=store, models=[model], log_dir=tmp_path_factory.mktemp(f"{model}-logs"),
               worker_env=PACED_ENV, web_env={**PACED_ENV, "FUNNEL_SHED": "0", "FUNNEL_REQUEST_TIMEOUT_S": "30",
                                              **web_env}, **stack) as running:
        yield running
