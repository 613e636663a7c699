"""Funnel's Redis Lua scripts: one file each in common/link/lua/, read and registered from here.

Each file opens with a header naming every KEYS[i] and ARGV[i] it reads and what it returns. A
script that calls a shared snippet says so in a line `-- include: <file>.lua`; the snippet's text
is put before the script's (Lua needs a local function defined before it is called), so Redis
always runs one self-contained script. The files ship in the package (pyproject's package-data).
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from funnel.common.link.connection import on_cluster
from funnel.common.link.line import Line

HOME = Path(__file__).parent / "lua"
_INCLUDE = re.compile(r"^-- include: (\w+)\.lua\b", re.MULTILINE)


def names() -> list[str]:
    """Every script and snippet, by file name without .lua."""
    return sorted(path.stem for path in HOME.glob("*.lua"))


@functools.cache
def source(name: str) -> str:
    """The text Redis runs for `name`: the snippets it includes, then its own file."""
    text = (HOME / f"{name}.lua").read_text(encoding="utf-8")
    return "".join(source(included) for included in _INCLUDE.findall(text)) + text


def register(client: redis.Redis, name: str) -> Script:
    """The script, callable as script(keys=[...], args=[...]) on this client or a pipeline of it
    (EVALSHA, loaded on first use)."""
    return client.register_script(source(name))


class Runner:
    """A script a thread runs again and again (a worker's take and reply): EVALSHA on that thread's
    own line (common/link/line.py), whose round trip costs about half the client CPU of redis-py's
    call (docs/performance.md); on a Redis Cluster, redis-py's Script, whose client finds the
    keys' node. Where Redis answers NOSCRIPT (restarted, or flushed), loaded and run again in one
    round trip; a round trip whose connection fails is sent again once (the client's retry), so
    the script must bear running twice."""

    def __init__(self, client: redis.Redis, name: str):
        self.source = source(name)
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()  # as Redis names it
        # On one Redis the runner holds a line (its client's pool), never the client itself: the
        # cache below forgets it with its client.
        self.script = register(client, name) if on_cluster(client) else None
        self.line = Line(client) if self.script is None else None

    def __call__(self, keys: list, args: list, also: Sequence[tuple] = ()):
        """The script's answer; `also`, plain commands whose answers nobody reads, go in the same round
        trip after it (on a cluster, a round trip of their own after it, as their keys' node may not be
        the script's)."""
        if self.script is not None:
            answer = self.script(keys=keys, args=args)
            if also:
                send(self.script.registered_client, also)
            return answer
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        assert self.line is not None
        answer = self.line.exchange([command, *also])[0]  # also's answers: the caller's figures, never its answer
        if isinstance(answer, NoScriptError):
            answer = self.line.exchange([("SCRIPT", "LOAD", self.source), command])[1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def send(client: redis.Redis | redis.RedisCluster, commands: Sequence[tuple]) -> list:
    """Plain commands in one pipeline (one round trip a node on a cluster), their answers in order."""
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute()


_runners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # client -> {name: Runner}
_runners_lock = threading.Lock()


def runner(client: redis.Redis, name: str) -> Runner:
    """The client's Runner of the script, made at the first call (a worker takes and answers every
    batch with one): one line per thread and client, however often it is asked for."""
    with _runners_lock:
        made = _runners.setdefault(client, {})
        if name not in made:
            made[name] = Runner(client, name)
        return made[name]
