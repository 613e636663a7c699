"""A model version's inference statistics: what its workers add up in Redis, batch by batch, as Triton counts.

Every worker of a model version adds each batch's figures to one hash, `funnel:stats:{<model>}:<version>`
(common/contracts/keys.py), in the round trip that answers the batch (worker/reply.py), so the totals
are the version's across all its workers, kept when a worker dies or leaves, since the first batch
after Redis last lost its data. The web tier renders them as Triton's model statistics (GET
/v2/models/<name>/stats, the ModelStatistics RPC; web/protocols/triton.py). The field names live here
and nowhere else.

As Triton counts: a request is a job (a request of more items than the batch size is several jobs),
`success`/`fail` count jobs answered and their time from the push to the answer; the queue and compute
durations are those of the successful jobs, each charged its whole batch's collate (compute input),
run (compute infer) and finish (compute output) time; `inferences` counts items run, `executions`
batches; and per batch size, its batches and their compute times, once each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis

from funnel.common.contracts.keys import Keys

# Totals of the version's jobs: (count field, nanoseconds field).
SUCCESS = ("success", "success_ns")
FAIL = ("fail", "fail_ns")
# Nanoseconds of the successful jobs (their count is SUCCESS's).
QUEUE_NS, INPUT_NS, INFER_NS, OUTPUT_NS = "queue_ns", "input_ns", "infer_ns", "output_ns"
INFERENCES, EXECUTIONS = "inferences", "executions"
LAST = "last"  # epoch ms of the last batch answered: set, not added
# Per batch size n: its batches, and their compute times once each.
BATCH_FIELDS = ("count", INPUT_NS, INFER_NS, OUTPUT_NS)


def batch_field(size: int, name: str) -> str:
    """The field of one figure of batches of `size` items ("b8.count", "b8.infer_ns")."""
    return f"b{size}.{name}"


@dataclass(frozen=True, kw_only=True)
class BatchFigures:
    """What one batch adds: its items, its jobs' outcomes and durations, and its steps' times."""

    items: int
    ok_ns: list[int]  # each successful job's time from its push to its answer
    failed_ns: list[int]  # the same of each failed job
    queue_ns: int  # the successful jobs' time in the queue, all together
    collate_ns: int
    run_ns: int
    finish_ns: int


def increments(figures: BatchFigures) -> dict[str, int]:
    """The hash fields one batch adds to (nothing for a batch that ran no item and answered no job)."""
    ok, failed = len(figures.ok_ns), len(figures.failed_ns)
    out = {SUCCESS[0]: ok, SUCCESS[1]: sum(figures.ok_ns), FAIL[0]: failed, FAIL[1]: sum(figures.failed_ns),
           QUEUE_NS: figures.queue_ns, INPUT_NS: ok * figures.collate_ns, INFER_NS: ok * figures.run_ns,
           OUTPUT_NS: ok * figures.finish_ns}
    if figures.items:
        out |= {INFERENCES: figures.items, EXECUTIONS: 1, batch_field(figures.items, "count"): 1,
                batch_field(figures.items, INPUT_NS): figures.collate_ns,
                batch_field(figures.items, INFER_NS): figures.run_ns,
                batch_field(figures.items, OUTPUT_NS): figures.finish_ns}
    return {name: value for name, value in out.items() if value}


def commands(keys: Keys, model: str, version: int, added: Mapping[str, int], now_ms: int) -> list[tuple]:
    """The Redis commands that add one batch's increments to the version's hash (none for none)."""
    if not added:
        return []
    key = keys.stats(model, version)
    return [*(("HINCRBY", key, name, value) for name, value in added.items()), ("HSET", key, LAST, now_ms)]


def read(client: redis.Redis, keys: Keys, model: str, versions: Iterable[int]) -> dict[int, dict[str, int]]:
    """Each version's totals (field -> value; {} before its first batch), in one round trip."""
    listed = list(versions)
    pipe = client.pipeline(transaction=False)
    for version in listed:
        pipe.hgetall(keys.stats(model, version))
    found = pipe.execute()
    return {version: {k.decode(): int(v) for k, v in fields.items() if v.isdigit()}
            for version, fields in zip(listed, found)}


def batch_sizes(fields: Mapping[str, int]) -> list[int]:
    """The batch sizes the totals have figures for, ascending."""
    sizes = {int(name[1:].partition(".")[0]) for name in fields
             if name.startswith("b") and name[1:].partition(".")[0].isdigit()}
    return sorted(sizes)
