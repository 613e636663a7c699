"""worker/residency.py against a real redis-server: at most N loaded, the least recently used out but
never one pinned by a batch, one load at a time, claims two workers respect, failures not retried
in a loop; and what the web tier makes of the members' fields (web/queueing/shedding.py)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
import redis

from funnel.common.contracts import registry
from funnel.common.store import ModelSpec
from funnel.web.queueing.shedding import capacity
from funnel.worker.residency import CLAIM_TTL_S, Limits, Loaded, Model, Residency
from funnel.worker.stats import Stats
from tests.support import wait_for


def spec(name: str) -> ModelSpec:
    return ModelSpec(name=name, task="t", path=Path("/nonexistent") / name, batch_size=4, config={})


class Loader:
    """Stands in for loading a model: answers at once, fails for names in `broken`, or waits for `gate`
    (only the loads of `hangs`, when it names any)."""

    def __init__(self, broken: tuple[str, ...] = (), hangs: tuple[str, ...] = ()):
        self.broken, self.hangs, self.calls = broken, hangs, []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, s: ModelSpec) -> Loaded:
        self.calls.append(s.name)
        if not self.hangs or s.name in self.hangs:
            self.gate.wait(10)
        if s.name in self.broken:
            raise FileNotFoundError(f"no such file: {s.name}.onnx")
        return Loaded(task=object(), backend=Unrun())  # type: ignore[arg-type]  # never run here


class Unrun:
    """A backend never run here: only let go of when its model is evicted."""

    closed = False

    def close(self) -> None:
        self.closed = True


def residency(client, keys, names, worker="w1", limits=None, loader=None, sizes=None) -> Residency:
    limits = limits or Limits(max_resident=2)
    models = [Model(spec(n), f"{worker}.{n}.1", Stats(), (sizes or {}).get(n, 1.0)) for n in names]
    return Residency(client, keys, worker, models, limits, loader or Loader())


def load(r: Residency, name: str, worker="w1") -> bool:
    member = f"{worker}.{name}.1"
    if not r.load(member):
        return False
    wait_for(lambda: r.loading is None, timeout_s=10, what=f"{name} loaded")
    return True


def test_the_least_recently_used_goes_never_one_pinned(redis_client, keys):
    r = residency(redis_client, keys, ["a", "b", "c"])
    assert load(r, "a") and load(r, "b")
    assert r.pin("w1.a.1") is not None  # a batch of a is taken: a is the most recently used, and pinned
    r.unpin("w1.a.1")
    a_backend = r.models["w1.a.1"].loaded.backend
    r.pin("w1.b.1")  # b used last, and its batch not answered yet
    redis_client.delete(keys.loading("c"))
    assert load(r, "c")
    assert [r.state(f"w1.{n}.1") for n in "abc"] == ["cold", "resident", "resident"]  # a went, b was pinned
    assert a_backend.closed  # let go of: a model run in Python has its process ended
    assert r.models["w1.a.1"].stats.totals["evictions"] == 1
    r.pin("w1.c.1")
    redis_client.delete(keys.loading("a"))
    assert not r.load("w1.a.1")  # b and c both pinned: no room, nothing evicted
    assert [r.state(f"w1.{n}.1") for n in "abc"] == ["cold", "resident", "resident"]
    r.unpin("w1.b.1")  # b answered: b goes, though used after c was loaded, since c is pinned
    assert load(r, "a")
    assert [r.state(f"w1.{n}.1") for n in "abc"] == ["resident", "cold", "resident"]


def test_a_batch_pins_a_model_until_it_is_answered(redis_client, keys):
    r = residency(redis_client, keys, ["a", "b"], limits=Limits(max_resident=1))
    assert load(r, "a")
    r.pin("w1.a.1")
    assert not r.load("w1.b.1")  # no room: a's batch runs
    assert r.state("w1.a.1") == "resident" and r.state("w1.b.1") == "cold"
    r.unpin("w1.a.1")
    assert load(r, "b")
    assert r.state("w1.a.1") == "cold" and r.pin("w1.a.1") is None  # evicted: nothing to pin


def test_a_model_is_evicted_on_demand_only_when_resident_and_unpinned(redis_client, keys):
    """What a worker of several models does with a version the repository API unloaded."""
    r = residency(redis_client, keys, ["a", "b"])
    assert not r.evict("w1.a.1", "unloaded")  # cold: nothing to evict
    assert load(r, "a")
    r.pin("w1.a.1")
    assert not r.evict("w1.a.1", "unloaded")  # its batch not answered yet
    r.unpin("w1.a.1")
    backend = r.models["w1.a.1"].loaded.backend
    assert r.evict("w1.a.1", "unloaded")
    assert r.state("w1.a.1") == "cold" and backend.closed and r.models["w1.a.1"].stats.totals["evictions"] == 1


def test_the_memory_budget_counts_the_models_files(redis_client, keys):
    r = residency(redis_client, keys, ["small", "large", "other"], limits=Limits(max_resident=0, max_resident_mb=100.0),
                  sizes={"small": 30.0, "large": 60.0, "other": 50.0})
    assert load(r, "small") and load(r, "large")  # 90 of 100
    assert load(r, "other")  # 50 more: the least recently used (small) is not enough, large goes too
    assert [r.state(f"w1.{n}.1") for n in ("small", "large", "other")] == ["cold", "cold", "resident"]


def test_one_load_at_a_time(redis_client, keys):
    loader = Loader()
    loader.gate.clear()
    r = residency(redis_client, keys, ["a", "b"], loader=loader)
    assert r.load("w1.a.1")
    assert r.state("w1.a.1") == "loading" and not r.load("w1.b.1")
    loader.gate.set()
    wait_for(lambda: r.loading is None, timeout_s=10)
    assert r.state("w1.a.1") == "resident" and load(r, "b")


def test_two_workers_do_not_both_load_a_model(redis_client, keys):
    loader = Loader()
    loader.gate.clear()
    first = residency(redis_client, keys, ["a"], worker="w1", loader=loader)
    second = residency(redis_client, keys, ["a"], worker="w2", loader=loader)
    assert first.load("w1.a.1")
    assert not second.load("w2.a.1")  # claimed by w1
    assert redis_client.get(keys.loading("a")) == b"w1"
    assert 0 < redis_client.pttl(keys.loading("a")) <= CLAIM_TTL_S * 1000
    first.renew()  # the taker renews it every turn
    loader.gate.set()
    wait_for(lambda: first.loading is None, timeout_s=10)
    assert not second.load("w2.a.1")  # kept until the registry shows it resident at w1
    assert loader.calls == ["a"]
    redis_client.delete(keys.loading("a"))  # lapsed
    assert load(second, "a", worker="w2")


def test_a_claim_lapses_when_its_loader_dies(redis_client, keys):
    redis_client.set(keys.loading("a"), "dead-worker", px=200)  # a worker killed mid-load
    r = residency(redis_client, keys, ["a"])
    assert not r.load("w1.a.1")
    wait_for(lambda: not redis_client.exists(keys.loading("a")), timeout_s=5)
    assert load(r, "a")


def test_a_model_that_fails_to_load_is_not_retried_in_a_loop(redis_client, keys):
    loader = Loader(broken=("broken",))
    r = residency(redis_client, keys, ["broken", "fine"], limits=Limits(max_resident=2, retry_s=0.5), loader=loader)
    assert load(r, "broken")
    assert r.state("w1.broken.1") == "failed"
    assert r.fields()["w1.broken.1"] == {"process": "w1", "state": "failed",
                                       "load_error": "FileNotFoundError: no such file: broken.onnx"}
    redis_client.delete(keys.loading("broken"))
    assert not r.due("w1.broken.1") and not r.load("w1.broken.1")  # not before its retry is due
    assert load(r, "fine")  # the others load and serve
    wait_for(lambda: r.due("w1.broken.1"), timeout_s=5, what="the failed load's retry due")
    redis_client.delete(keys.loading("broken"))
    assert r.due("w1.broken.1") and load(r, "broken")
    assert loader.calls == ["broken", "fine", "broken"]


def test_a_load_that_hangs_is_given_up_at_its_timeout(redis_client, keys):
    loader = Loader(hangs=("hung",))
    loader.gate.clear()  # the load of hung blocks until the gate opens
    published = []
    r = Residency(redis_client, keys, "w1", [Model(spec(n), f"w1.{n}.1", Stats(), 1.0) for n in ("hung", "fine")],
                  Limits(max_resident=2, load_timeout_s=0.3), loader, lambda: published.append(r.state("w1.hung.1")))
    assert r.load("w1.hung.1")
    r.renew()  # within its timeout: the claim is kept
    assert r.state("w1.hung.1") == "loading" and redis_client.get(keys.loading("hung")) == b"w1"
    assert not r.load("w1.fine.1")  # one load at a time
    wait_for(lambda: r.renew() or r.state("w1.hung.1") == "failed", timeout_s=5, what="the load given up")
    assert r.fields()["w1.hung.1"]["load_error"].startswith("TimeoutError: the load took longer than 0.3 s")
    assert published == ["loading", "failed"]  # the heartbeat told at once, of the start and the end
    assert not redis_client.exists(keys.loading("hung"))  # released: a peer may load it now
    assert r.loading is None and load(r, "fine")  # the next load is free, though the hung thread runs on
    assert not r.due("w1.hung.1") and not r.load("w1.hung.1")  # not retried in a loop
    hung = [t for t in threading.enumerate() if t.name == "load hung"]
    loader.gate.set()  # the hung load returns at last: what it loaded is dropped
    for thread in hung:
        thread.join(5)
    assert r.state("w1.hung.1") == "failed" and r.pin("w1.hung.1") is None
    assert r.state("w1.fine.1") == "resident" and r.models["w1.hung.1"].stats.totals["loads"] == 0
    assert loader.calls == ["hung", "fine"]


def test_a_timeout_releases_only_its_own_claim(redis_client, keys):
    loader = Loader()
    loader.gate.clear()
    r = residency(redis_client, keys, ["a"], limits=Limits(max_resident=1, load_timeout_s=0.2), loader=loader)
    assert r.load("w1.a.1")
    redis_client.set(keys.loading("a"), "w2")  # lapsed and taken by a peer meanwhile (a stalled taker)
    wait_for(lambda: r.renew() or r.state("w1.a.1") == "failed", timeout_s=5, what="the load given up")
    assert redis_client.get(keys.loading("a")) == b"w2"  # the peer's claim stands
    loader.gate.set()


@pytest.mark.parametrize("states, cold_s, unavailable", [
    (["resident", "cold"], 0.0, ""),
    (["cold", "cold"], 0.4, ""),
    (["failed", "cold"], 0.4, ""),
    (["failed", "failed"], 0.4, "OSError: gone"),
])
def test_the_web_tier_predicts_the_load_and_names_a_failure(states, cold_s, unavailable):
    workers = []
    for i, state in enumerate(states):
        stats = Stats()
        stats.add(loads=2, load_seconds=0.8 if i else 0.4)
        workers.append({"id": f"w{i}.m.1", "model": "m", "version": "1", "batch_size": "4", **stats.fields(),
                        "process": f"w{i}", "state": state,
                        "load_error": "OSError: gone" if state == "failed" else ""})
    found = capacity(workers, "m", 1)
    assert found.cold_s == pytest.approx(cold_s)
    assert found.unavailable == unavailable
    assert registry.load_s(workers[1]) == pytest.approx(0.4)


def test_a_model_whose_work_waits_is_spared_unless_told(redis_client, keys):
    r = residency(redis_client, keys, ["a", "b", "c"])
    assert load(r, "a") and load(r, "b")  # a used longest ago
    redis_client.delete(keys.loading("c"))
    assert not r.load("w1.c.1", spare=frozenset({"w1.a.1", "w1.b.1"}))  # both have work waiting
    assert r.load("w1.c.1", spare=frozenset({"w1.a.1"}))  # b's work is done: b goes, a stays
    wait_for(lambda: r.loading is None, timeout_s=10)
    assert [r.state(f"w1.{n}.1") for n in "abc"] == ["resident", "cold", "resident"]


class Lagging(redis.Redis):
    """A real Redis client whose every round trip starts up to 2 ms late, as on a host whose threads wait
    for the interpreter's lock or the CPU: a beat's reading and its write drift apart."""

    @staticmethod
    def _lag() -> None:
        time.sleep(random.random() * 0.002)  # the latency itself, not a wait on a condition

    def execute_command(self, *args, **options):
        self._lag()
        return super().execute_command(*args, **options)

    def pipeline(self, transaction=True, shard_hint=None):
        self._lag()
        return super().pipeline(transaction, shard_hint)


def test_the_registry_never_shows_more_resident_than_the_limit(redis_server, redis_client, keys):
    """Loads and evictions churn while a heartbeat beats on its own clock as well: every reading of the
    registry, by the web tier's call, shows at most the limit resident, and as many loaded as the worker has."""
    from funnel.worker.heartbeat import Heartbeat

    names = [f"m{i}" for i in range(8)]
    lagging = Lagging.from_url(redis_server.url)  # the worker's Redis, as a busy host reaches it
    beat = Heartbeat(lagging, keys, "w1.m0.1", {"model": "m0"}, recovery=None, ttl_s=30)  # type: ignore[arg-type]
    for name in names[1:]:
        beat.join(f"w1.{name}.1", {"model": name})
    r = Residency(lagging, keys, "w1", [Model(spec(m.info["model"]), m.worker_id, m.stats, 1.0)
                                        for m in beat.members], Limits(max_resident=3), Loader(), beat.beat)
    beat.live = r.fields
    beat.beat()
    done, most, readings = threading.Event(), [0], [0]

    def churn() -> None:
        for turn in range(40):
            member = f"w1.{names[turn % len(names)]}.1"
            redis_client.delete(keys.loading(names[turn % len(names)]))
            if r.load(member):
                wait_for(lambda: r.loading is None, timeout_s=10)
        done.set()

    def clock() -> None:  # the heartbeat thread's beats, far more often than its TTL asks
        while not done.wait(0.002):
            beat.beat()

    threads = [threading.Thread(target=churn), threading.Thread(target=clock)]
    for thread in threads:
        thread.start()
    while not done.is_set():
        workers = registry.live_workers(redis_client, keys)
        most[0] = max(most[0], sum(registry.resident(w) for w in workers))
        readings[0] += 1
    for thread in threads:
        thread.join()
    assert readings[0] > 50 and most[0] == 3, (most, readings)
    assert sum(registry.resident(w) for w in registry.live_workers(redis_client, keys)) == 3


def multiplex(client, keys, names: list[str]):
    """A Multiplex over `names`, every one loaded, whose steps are never run (what it picks is tested)."""
    from funnel.worker.linger import Linger
    from funnel.worker.multiplex import Multiplex, Served
    from funnel.worker.queue import JobQueue

    stop = threading.Event()
    r = residency(client, keys, names, limits=Limits(max_resident=len(names)))
    for name in names:
        client.delete(keys.loading(name))
        assert load(r, name)
    served = [Served(spec(n), f"w1.{n}.1", JobQueue(client, keys, model=n, worker_id=f"w1.{n}.1"), None,  # type: ignore[arg-type]
                     Linger(0, stop), r.models[f"w1.{n}.1"].stats) for n in names]
    return Multiplex(client, keys, served, r, lambda *_: None, cold_after_s=2.0, bulk_share=0.25, stop=stop)  # type: ignore[arg-type,return-value]


def picks(m, turns: int) -> list[str]:
    out = []
    for _ in range(turns):
        m._look()
        chosen = m._choose()
        out.append(chosen.spec.name if chosen else "")
    return out


def test_across_models_high_goes_first_and_low_keeps_its_floor_share(redis_client, keys):
    from funnel.worker.lanes import LOW_FLOOR

    m = multiplex(redis_client, keys, ["busy", "quiet"])
    redis_client.lpush(keys.queue("busy", 1, "high"), *[b"job"] * 10)
    redis_client.lpush(keys.queue("quiet", 1, "low"), *[b"job"] * 10)
    chosen = picks(m, 50)
    assert chosen.count("quiet") == pytest.approx(50 * LOW_FLOOR, abs=1)  # low's floor share, no more
    assert chosen.count("busy") == 50 - chosen.count("quiet")


def test_across_models_of_one_lane_the_longest_waiting_goes_first(redis_client, keys):
    m = multiplex(redis_client, keys, ["a", "b", "c"])
    for name in ("a", "b", "c"):
        redis_client.lpush(keys.queue(name), *[b"job"] * 10)
    assert sorted(picks(m, 3)) == ["a", "b", "c"] and sorted(picks(m, 6)) == ["a", "a", "b", "b", "c", "c"]
    redis_client.delete(keys.queue("b"))
    assert "b" not in picks(m, 4)  # no work, never picked
