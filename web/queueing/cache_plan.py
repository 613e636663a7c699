"""A request's items of a cached model (common/result_cache.py): known, borrowed, or computed.

The pipeline (web/pipeline.py, `_run_cached`) makes one job of each distinct item, named by the item's
cache ident; the push script (common/link/lua/push.lua) answers, in its one round trip, what
became of each: known (its entry: the item's reply), under way for another request (that job's id
and deadline: the worker's reply script sends its reply to this request's list too), or queued,
marked as under way. Identical items of one request are one job.

A borrowed job is waited for until this request's deadline or that job's, whichever is first (a
job past its deadline is dropped unrun); an item whose borrowed job went unanswered by then, or
whose entry would not decode, is asked again in the pipeline's next round (`Settled.again`): by then
it is known, under way once more, or queued by this request. Asking again charges the API key's rate
and cap nothing more: the request was admitted once. A job whose client leaves is still run: others
may be waiting on it, and its answer fills the cache.
"""

from __future__ import annotations

import asyncio
from dataclasses import KW_ONLY, dataclass, field

from funnel.common import result_cache
from funnel.common.contracts.wire import Reply, now_ms
from funnel.common.tasks import Context, Inputs
from funnel.web.queueing.inbox import Inbox, Waiter
from funnel.web.queueing.push_script import CacheLookup

HIT, MISS, COALESCED = "hit", "miss", "coalesced"  # an item's answer: known; computed for it; for another
GRACE_MS = 250  # past a borrowed job's deadline: a worker that took it just in time answers soon after


@dataclass(frozen=True)
class Round:
    """Distinct items of a plan asked in one push (their indices), and whether to read their entries
    (False: they were found unreadable, and the items are computed again)."""

    distinct: list[int]
    read: bool = True


@dataclass
class Settled:
    """What became of a round's items, in its order: each one's reply, unless it must be asked again."""

    replies: list[Reply | None]
    kinds: list[str]  # each one's HIT, MISS or COALESCED
    _: KW_ONLY
    unreadable: list[int] = field(default_factory=list)  # known, but its entry would not decode
    unanswered: list[int] = field(default_factory=list)  # its borrowed job went unanswered in time

    def again(self, asked: Round) -> list[Round]:
        """The rounds that ask again what this one could not answer."""
        return [Round([asked.distinct[i] for i in todo], read) for read, todo in
                ((False, self.unreadable), (True, self.unanswered)) if todo]


@dataclass
class Plan:
    """A request's items as the cache knows them: the distinct ones, one job each."""

    items: list[Inputs] = field(default_factory=list)  # the distinct items, in first-seen order
    idents: list[str] = field(default_factory=list)  # each one's cache ident
    of_item: list[int] = field(default_factory=list)  # each of the request's items: its distinct item
    contexts: list[Context | None] | None = None  # the distinct items' contexts (None: no item has one)

    @classmethod
    def of(cls, policy: result_cache.CachePolicy, owner: str, inputs: list[Inputs], raw: bool,
           contexts: list[Context | None] | None = None) -> Plan:
        plan, seen = cls(contexts=None if contexts is None else []), dict[str, int]()
        scope = policy.scope(owner)
        for i, item in enumerate(inputs):
            context = None if contexts is None else contexts[i]
            ident = result_cache.ident(scope, result_cache.digest(item, raw, context))
            at = seen.setdefault(ident, len(plan.items))
            if at == len(plan.items):
                plan.items.append(item)
                plan.idents.append(ident)
                if plan.contexts is not None:
                    plan.contexts.append(context)
            plan.of_item.append(at)
        return plan

    def parts(self, asked: Round) -> tuple[list[list[Inputs]], list[list[Context | None] | None]]:
        """The round's jobs' items and contexts: one item a job."""
        contexts = [None if self.contexts is None else self.contexts[k] for k in asked.distinct]
        return [[self.items[k]] for k in asked.distinct], [None if c is None else [c] for c in contexts]

    def lookup(self, asked: Round, job_ids: list[str], reply_to: str, known_only: bool = False) -> CacheLookup:
        return CacheLookup(idents=[self.idents[k] for k in asked.distinct], job_ids=job_ids, reply_to=reply_to,
                           read=asked.read, known_only=known_only)


def x_cache(states: list[str]) -> str:
    """The X-Cache header of a request's items' states: HIT (all known), MISS (none), PARTIAL."""
    hits = sum(state == HIT for state in states)
    return "HIT" if hits == len(states) else "MISS" if not hits else "PARTIAL"


async def settle(inbox: Inbox, model: str, states: list[bytes], waiter: Waiter, ids: list[str],
                 deadline: int) -> Settled:
    """A round's items' replies, from the push script's word on each (states): known, borrowed, or
    queued under ids[k] (whose replies the waiter awaits)."""
    settled = Settled([None] * len(states), [MISS] * len(states))
    queued, borrowed = [], {}
    for k, state in enumerate(states):
        mark = state[:1]
        if mark == b"=":
            known = result_cache.entry_reply(state[1:])
            if known is None:
                settled.unreadable.append(k)
                continue
            settled.replies[k], settled.kinds[k] = known, HIT
        elif mark == b"~":
            job_id, _, job_deadline = state[1:].decode().partition(" ")
            borrowed[k] = (job_id, int(job_deadline or 0))
            settled.kinds[k] = COALESCED
        else:
            queued.append(k)
    if queued or borrowed:  # else every item was known: nothing to wait for
        waiter.narrow(len(queued))  # the others' ids, never queued, are forgotten with the request's
        came, got = await _awaited(inbox, model, waiter, [ids[k] for k in queued], deadline, borrowed)
        for k, reply in zip(queued, came, strict=True):
            settled.replies[k] = reply
        for k, (job_id, _) in borrowed.items():
            settled.replies[k] = got.get(job_id)
            if settled.replies[k] is None:
                settled.unanswered.append(k)
    return settled


def each_state(plan: Plan, kinds: list[str]) -> list[str]:
    """Each item's state: its distinct item's, and for an identical item after it, coalesced
    (unless known)."""
    seen: set[int] = set()
    out = []
    for k in plan.of_item:
        out.append(kinds[k] if k not in seen or kinds[k] == HIT else COALESCED)
        seen.add(k)
    return out


def answered(reply: Reply | None) -> Reply:
    assert reply is not None  # every item is known, came, or was asked again
    return reply


async def _awaited(inbox: Inbox, model: str, waiter: Waiter, queued: list[str], deadline: int,
                   borrowed: dict[int, tuple[str, int]]) -> tuple[list[Reply], dict[str, Reply]]:
    """The replies of the jobs this request queued (in order), and of those it borrowed (by job
    id), each awaited alone where the other is none."""
    if not borrowed:
        return await inbox.collect(waiter, queued, deadline), {}
    lent = sorted({job_id for job_id, _ in borrowed.values()})
    lender = inbox.borrow(model, lent)
    try:
        if not queued:
            return [], await _borrowed(lender, deadline, borrowed)
        came, got = await asyncio.gather(inbox.collect(waiter, queued, deadline), _borrowed(lender, deadline, borrowed))
        return came, got
    finally:
        inbox.give_back(lent, lender)


async def _borrowed(lender: Waiter, deadline: int, borrowed: dict[int, tuple[str, int]]) -> dict[str, Reply]:
    """The borrowed jobs' replies that came before this request's deadline or theirs, by job id."""
    until = min(deadline, max(job_deadline for _, job_deadline in borrowed.values()) + GRACE_MS)
    await asyncio.wait([lender.future], timeout=max(0.0, (until - now_ms()) / 1000))
    failed = lender.future.exception() if lender.future.done() else None
    if failed is not None:
        raise failed
    return {reply.id: reply for reply in lender.got}
