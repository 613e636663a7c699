"""Redis key names, human-readable under one prefix so redis-cli shows the system.

Every key one job touches in one atomic step (the push script, the take, the
reply MULTI, recovery's claim and requeue) carries its model as a Redis
Cluster hash tag, `{<model>}`: Redis hashes only what is between the braces,
so on a cluster a model's queues, its workers' in-flight lists and heartbeat
hashes, its dead letters and the reply lists its workers answer to share one
hash slot (one node), and different models spread over the nodes. On a single
Redis the braces are just characters. Each version of a model (the store's
`<name>/<version>/`) has its own queues (three priority lanes, bulk), under the model's tag, so a
version's workers take only its jobs and every version stays in the model's
slot. Layout (docs/redis.md):

    funnel:queue:{text-embedding}:<version>    funnel:bulk:{text-embedding}:<version>
    funnel:queue-high:{text-embedding}:<version>  funnel:queue-low:{text-embedding}:<version>
    funnel:inflight:{text-embedding}:<worker>  funnel:recovering:{text-embedding}:<worker>[:lock]
    funnel:worker:{text-embedding}:<worker>    funnel:dead:{text-embedding}
    funnel:loading:{text-embedding}:<version>  (the worker loading it, worker/residency.py)
    funnel:reply:{text-embedding}:web-<hex>    (one web process's inbox for the model)
    funnel:traffic:{text-embedding}            (version -> weight, common/contracts/traffic.py)
    funnel:unloaded:{text-embedding}           (its unloaded versions, common/contracts/repository.py)
    funnel:cache:{text-embedding}:<version>:<scope>:<digest>          (a result, common/result_cache.py)
    funnel:cache-pending:{text-embedding}:<version>:<scope>:<digest>  (its computation under way)
    funnel:stats:{text-embedding}:<version>    (its workers' totals, common/contracts/statistics.py)

An async or bulk job's own keys carry its job id as their tag instead, so a
job's record and results share one slot (each job lands on some node, not its
model's), and the store, cancel and webhook scripts that touch them together
run there; its Idempotency-Keys carry the model's tag, so the submit's MULTI
holds them with the bulk queue it pushes to:

    funnel:job:{<job id>}                      funnel:job:{<job id>}:results
    funnel:idempotency:{text-embedding}:<sha256 of the key>

On a cluster a job's slot is not its model's: a worker stores a bulk item's
result (common/bulk/jobs.py) before, not inside, the reply script that forgets the
message, and the record goes in a step before the items are queued
(common/bulk/job_store.py). Keys read only by single-key commands or scripts of one
key (funnel:workers, funnel:epoch, funnel:device-claims, the due webhooks funnel:webhooks)
carry no tag (docs/redis.md, "Redis Cluster").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from funnel.common.contracts.priority import LANES, NORMAL

# Model names and worker ids end up inside keys: keep them to a safe alphabet.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ValueError(f"not a valid name: {name!r}")
    return name


def check_version(version: int) -> int:
    """A model version: a positive integer, as Triton and the Open Inference Protocol number them."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"not a valid model version: {version!r} (a positive integer)")
    return version


def tag(model: str) -> str:
    """The hash tag of a model's keys: on Redis Cluster they all hash to one slot."""
    return "{" + check_name(model) + "}"


@dataclass(frozen=True)
class Keys:
    prefix: str = "funnel"
    # On Redis Cluster a bulk job's keys live in the job's slot, not its model's: a script or MULTI
    # of the model's keys never writes them (is_reply), and a due webhook is marked apart (common/bulk/jobs.py).
    cluster: bool = False

    def __post_init__(self) -> None:
        if "{" in self.prefix or "}" in self.prefix:
            raise ValueError(f"the key prefix may not hold braces (hash tags): {self.prefix!r}")

    def queue(self, model: str, version: int = 1, lane: str = "normal") -> str:
        """List of msgpack jobs for one version of a model in one priority lane (common/contracts/priority.py):
        web LPUSHes, that version's workers take from the right; normal is the queue as it always was."""
        if lane not in LANES:
            raise ValueError(f"not a priority lane: {lane!r}")
        kind = "queue" if lane == NORMAL else f"queue-{lane}"
        return f"{self.prefix}:{kind}:{tag(model)}:{check_version(version)}"

    def reply(self, model: str, name: str) -> str:
        """List of msgpack replies for jobs of `model`: one web process's inbox ("web-<hex>"), or
        a list of its own for jobs pushed by hand; in the model's slot, as its workers' reply MULTI needs."""
        return f"{self.prefix}:reply:{tag(model)}:{check_name(name)}"

    def is_reply(self, key: str, model: str) -> bool:
        """A key a worker of `model` may write an answer to in the model's own atomic steps (the reply
        script, recovery's requeue MULTI): the model's reply list, or (not on a cluster) a bulk job's
        results hash. On a cluster that hash is in its job's slot: stored apart (answers_to)."""
        head = f"{self.prefix}:reply:{tag(model)}:"
        return (key.startswith(head) and bool(NAME_PATTERN.match(key[len(head):]))) or (
            not self.cluster and bool(self.job_of_results(key)))

    def bulk(self, model: str, version: int = 1) -> str:
        """List of msgpack jobs that are items of async and bulk jobs for one version of a model:
        taken after that version's interactive queue."""
        return f"{self.prefix}:bulk:{tag(model)}:{check_version(version)}"

    def taken_from(self, model: str, version: int = 1) -> list[str]:
        """Every list a worker of the model version takes jobs from, in the order it serves them: the
        priority lanes, high first, then the bulk queue (what an autoscaler watches: deploy/k8s/)."""
        return [*(self.queue(model, version, lane) for lane in LANES), self.bulk(model, version)]

    def traffic(self, model: str) -> str:
        """Hash: version -> weight, the model's traffic policy (common/contracts/traffic.py, the one home
        of how it is read and written); absent: the highest live version takes everything."""
        return f"{self.prefix}:traffic:{tag(model)}"

    def unloaded(self, model: str) -> str:
        """Set: the model's versions unloaded through the repository API, each a decimal string
        (common/contracts/repository.py); absent: every version in the store is served."""
        return f"{self.prefix}:unloaded:{tag(model)}"

    def answers_to(self, key: str, model: str) -> bool:
        """Whether a job taken by a worker of `model` may name this key as its reply_to: the model's
        reply list, or a bulk job's results hash (on a cluster stored in a step of its own)."""
        return self.is_reply(key, model) or bool(self.job_of_results(key))

    def job(self, job_id: str) -> str:
        """Hash: one async or bulk job's record (common/bulk/jobs.py), with a TTL; tagged with its id, so
        its results share its slot."""
        return self.job_prefix() + tag(job_id)

    def job_prefix(self) -> str:
        """What every job key starts with (a bulk item's message names its results hash)."""
        return f"{self.prefix}:job:"

    def job_results(self, job_id: str) -> str:
        """Hash: item index -> msgpack reply, the reply_to of every item of the job; same TTL and
        slot as the job's record."""
        return self.job(job_id) + ":results"

    def job_of(self, key: str) -> str:
        """The job id whose record this key is ("funnel:job:{<id>}"), else "" (a results hash too)."""
        head = self.job_prefix() + "{"
        if key.startswith(head) and key.endswith("}") and NAME_PATTERN.match(key[len(head):-1]):
            return key[len(head):-1]
        return ""

    def job_of_results(self, key: str) -> str:
        """The job id whose results hash this key is ("funnel:job:{<id>}:results"), else ""."""
        tail = ":results"
        return self.job_of(key[:-len(tail)]) if key.endswith(tail) else ""

    def file(self, file_id: str) -> str:
        """Hash: an uploaded batch input file (common/bulk/batch_store.py): its description and its
        bytes, with the job TTL; tagged with its id."""
        return f"{self.prefix}:file:{tag(file_id)}"

    def batches_of(self, owner: str) -> str:
        """Sorted set, every score 0: the batch ids an API key created (its owner hash; "anyone"
        where the server has no keys), read newest first by their time-prefixed ids; entries
        past the job TTL are trimmed as it is read."""
        return f"{self.prefix}:batches:{check_name(owner or 'anyone')}"

    def files_of(self, owner: str) -> str:
        """Sorted set, as batches_of: the input files an API key uploaded."""
        return f"{self.prefix}:files:{check_name(owner or 'anyone')}"

    def idempotency(self, model: str, digest: str) -> str:
        """String: the job id an Idempotency-Key created for a model, with the job's TTL; `digest` is
        the SHA-256 (hex) of the key folded with the submitting API key's owner hash, so each API key's
        Idempotency-Keys are its own (common/bulk/job_store.py). In the model's slot: the submit's MULTI
        watches and sets it with the model's bulk queue."""
        return f"{self.prefix}:idempotency:{tag(model)}:{check_name(digest)}"

    def webhooks_due(self) -> str:
        """Sorted set: job id -> when its webhook delivery is next due (ms); a claimed one is pushed
        a lease ahead, so a deliverer that dies hands it back (worker/webhook.py). No tag: every
        script that touches it touches no other key (on a single Redis the store and cancel
        scripts also mark it, with the job's keys)."""
        return f"{self.prefix}:webhooks"

    def limit(self, model: str, owner: str) -> str:
        """Hash: an API key's token bucket on a model (tokens, ms), while the key is limited by rate
        (web/queueing/limits.py; `owner` is the key's keyed hash, never the key)."""
        return f"{self.prefix}:limit:{tag(model)}:{check_name(owner)}"

    def running(self, model: str, owner: str) -> str:
        """Sorted set: an API key's requests under way on a model, token -> deadline (ms), while the
        key has a cap on them."""
        return f"{self.prefix}:running:{tag(model)}:{check_name(owner)}"

    def gone(self, model: str) -> str:
        """Sorted set: ids of a model's interactive jobs whose client left before its answer, each
        scored by its job's deadline (ms); a worker that takes one drops it unrun (common/link/lua/leave.lua)."""
        return f"{self.prefix}:gone:{tag(model)}"

    def cache(self, model: str, version: int, ident: str) -> str:
        """String: one item's result, a reply's wire bytes, kept for the model's cache TTL
        (common/result_cache.py; ident is "<scope>:<digest>"); in the model's slot, as the push and
        reply scripts read and write it with the model's queues and in-flight lists."""
        return f"{self.prefix}:cache:{tag(model)}:{check_version(version)}:{ident}"

    def cache_pending(self, model: str, version: int, ident: str) -> str:
        """Hash: the job computing an item the cache lacks (`job`, `deadline` ms) and the reply lists
        of the requests waiting for it (each a field), until its reply or its deadline."""
        return f"{self.prefix}:cache-pending:{tag(model)}:{check_version(version)}:{ident}"

    def stats(self, model: str, version: int = 1) -> str:
        """Hash: a model version's inference statistics, added to by each of its workers' batches in the
        round trip that answers it (common/contracts/statistics.py, the one home of its fields); in the
        model's slot, beside the in-flight list that round trip names."""
        return f"{self.prefix}:stats:{tag(model)}:{check_version(version)}"

    def inflight(self, model: str, worker_id: str) -> str:
        """Jobs one worker of `model` holds between taking and answering them."""
        return f"{self.prefix}:inflight:{tag(model)}:{check_name(worker_id)}"

    def inflight_pattern(self, model: str) -> str:
        """A SCAN pattern for every worker's in-flight list of a model."""
        return f"{self.prefix}:inflight:{tag(model)}:*"

    def recovering(self, model: str, worker_id: str) -> str:
        """A dead worker's jobs while a peer puts them back on their queue."""
        return f"{self.prefix}:recovering:{tag(model)}:{check_name(worker_id)}"

    def recovering_lock(self, model: str, worker_id: str) -> str:
        """Held by the one peer recovering a dead worker, with a TTL in case it dies too."""
        return self.recovering(model, worker_id) + ":lock"

    def worker(self, model: str, worker_id: str) -> str:
        """Hash describing a live worker, kept alive by its heartbeat TTL; in its model's slot, as
        recovery's claim script reads it with the worker's in-flight list."""
        return f"{self.prefix}:worker:{tag(model)}:{check_name(worker_id)}"

    def loading(self, model: str, version: int = 1) -> str:
        """String: the id of the worker loading a model version to serve it, with a short TTL its loader
        renews, so two workers with several models do not both load it for the same work
        (worker/residency.py, common/link/lua/load_claim.lua)."""
        return f"{self.prefix}:loading:{tag(model)}:{check_version(version)}"

    def workers(self) -> str:
        """Hash of registered worker id -> model, live or dead until recovered."""
        return f"{self.prefix}:workers"

    def dead(self, model: str) -> str:
        """Jobs that could not be decoded or answered."""
        return f"{self.prefix}:dead:{tag(model)}"

    def epoch(self) -> str:
        """String: a random token, set by a worker's heartbeat that finds it missing, never expiring: a
        new one (or none) tells the web tier that Redis lost its data (restarted empty, or failed over to a
        replica that never had it), so an empty registry may be workers yet to beat again
        (common/contracts/registry.py's epoch)."""
        return f"{self.prefix}:epoch"

    def device_claims(self) -> str:
        """Sorted set of recent FUNNEL_DEVICE=auto choices, "<device> <worker id>" scored by expiry (ms)."""
        return f"{self.prefix}:device-claims"

    def pattern(self, kind: str) -> str:
        """A SCAN pattern for every key of one kind: "queue", "inflight", "dead", "reply", ...
        (on a cluster, scan every primary: scan_keys)."""
        if kind not in ("queue", "queue-high", "queue-low", "bulk", "reply", "inflight", "recovering", "worker",
                        "dead", "job", "idempotency", "traffic", "unloaded", "gone", "limit", "running", "loading",
                        "file", "batches", "files", "cache", "cache-pending", "stats"):
            raise ValueError(f"no keys of kind {kind!r}")
        return f"{self.prefix}:{kind}:*"


def version_of(key: str) -> int:
    """The version a queue or bulk key names ("funnel:queue:{m}:2" -> 2), else 0."""
    end = key.find("}")
    head, _, tail = key[end + 1:].rpartition(":") if end >= 0 else ("", "", "")
    if head == "" and tail.isdigit() and tail == str(int(tail)) and int(tail) > 0:
        return int(tail)
    return 0


def model_of(key: str) -> str:
    """The model a tagged key belongs to ("funnel:inflight:{m}:w1" -> "m"), else ""."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1:end] if start >= 0 and end > start + 1 else ""
