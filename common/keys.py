"""Redis key names, human-readable under one prefix so redis-cli shows the system."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Model names and worker ids end up inside keys: keep them to a safe alphabet.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ValueError(f"not a valid name: {name!r}")
    return name


@dataclass(frozen=True)
class Keys:
    prefix: str = "funnel"

    def queue(self, model: str) -> str:
        """List of msgpack jobs: web LPUSHes, workers take from the right."""
        return f"{self.prefix}:queue:{check_name(model)}"

    def reply(self, job_id: str) -> str:
        """List holding one msgpack reply, with a TTL."""
        return f"{self.prefix}:reply:{check_name(job_id)}"

    def is_reply(self, key: str) -> bool:
        """A key a worker may answer to: a reply list, or a bulk job's results hash."""
        head = f"{self.prefix}:reply:"
        return (key.startswith(head) and bool(NAME_PATTERN.match(key[len(head):]))) or bool(
            self.job_of_results(key))

    def bulk(self, model: str) -> str:
        """List of msgpack jobs that are items of async and bulk jobs: taken after the interactive queue."""
        return f"{self.prefix}:bulk:{check_name(model)}"

    def job(self, job_id: str) -> str:
        """Hash: one async or bulk job's record (common/jobs.py), with a TTL."""
        return self.job_prefix() + check_name(job_id)

    def job_prefix(self) -> str:
        """What every job key starts with (a bulk item's message names its results hash)."""
        return f"{self.prefix}:job:"

    def job_results(self, job_id: str) -> str:
        """Hash: item index -> msgpack reply, the reply_to of every item of the job; same TTL as the job."""
        return self.job(job_id) + ":results"

    def job_of_results(self, key: str) -> str:
        """The job id whose results hash this key is, else ""."""
        head, tail = self.job_prefix(), ":results"
        if key.startswith(head) and key.endswith(tail):
            job_id = key[len(head):-len(tail)]
            if NAME_PATTERN.match(job_id):
                return job_id
        return ""

    def idempotency(self, model: str, digest: str) -> str:
        """String: the job id an Idempotency-Key (its SHA-256, hex) created for a model, with the job's TTL."""
        return f"{self.prefix}:idempotency:{check_name(model)}:{check_name(digest)}"

    def inflight(self, worker_id: str) -> str:
        """Jobs one worker holds between taking and answering them."""
        return f"{self.prefix}:inflight:{check_name(worker_id)}"

    def recovering(self, worker_id: str) -> str:
        """A dead worker's jobs while a peer puts them back on their queue."""
        return f"{self.prefix}:recovering:{check_name(worker_id)}"

    def recovering_lock(self, worker_id: str) -> str:
        """Held by the one peer recovering a dead worker, with a TTL in case it dies too."""
        return self.recovering(worker_id) + ":lock"

    def worker(self, worker_id: str) -> str:
        """Hash describing a live worker, kept alive by its heartbeat TTL."""
        return self.worker_prefix() + check_name(worker_id)

    def worker_prefix(self) -> str:
        """What every worker hash's name starts with (Lua scripts append an id)."""
        return f"{self.prefix}:worker:"

    def workers(self) -> str:
        """Hash of registered worker id -> model, live or dead until recovered."""
        return f"{self.prefix}:workers"

    def dead(self, model: str) -> str:
        """Jobs that could not be decoded or answered."""
        return f"{self.prefix}:dead:{check_name(model)}"

    def device_claims(self) -> str:
        """Sorted set of recent FUNNEL_DEVICE=auto choices, "<device> <worker id>" scored by expiry (ms)."""
        return f"{self.prefix}:device-claims"

    def pattern(self, kind: str) -> str:
        """A SCAN pattern for every key of one kind: "queue", "inflight", "dead", "reply", ..."""
        if kind not in ("queue", "bulk", "reply", "inflight", "recovering", "worker", "dead", "job",
                        "idempotency"):
            raise ValueError(f"no keys of kind {kind!r}")
        return f"{self.prefix}:{kind}:*"
