"""Funnel's Redis Lua scripts: one file each in common/lua/, read and registered from here.

Each file opens with a header naming every KEYS[i] and ARGV[i] it reads and what it returns. A
script that calls a shared snippet says so in a line `-- include: <file>.lua`; the snippet's text
is put before the script's (Lua needs a local function defined before it is called), so Redis
always runs one self-contained script. The files ship in the package (pyproject's package-data).
"""

from __future__ import annotations

import functools
import re
import threading
import weakref
from pathlib import Path

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from funnel.common.connection import on_cluster
from funnel.common.line import Line

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
    own line (common/line.py), whose round trip costs about half the client CPU of redis-py's
    call (docs/performance.md); on a Redis Cluster, redis-py's Script, whose client finds the
    keys' node. Loaded again when Redis answers NOSCRIPT (restarted, or flushed); a round trip
    whose connection fails is sent again once (the client's retry), so the script must bear
    running twice."""

    def __init__(self, client: redis.Redis, name: str):
        self.script = register(client, name)
        self.line = None if on_cluster(client) else Line(client)

    def __call__(self, keys: list, args: list):
        if self.line is None:
            return self.script(keys=keys, args=args)
        command = ("EVALSHA", self.script.sha, len(keys), *keys, *args)
        answer = self.line.exchange([command])[0]
        if isinstance(answer, NoScriptError):
            self.script.registered_client.script_load(self.script.script)
            answer = self.line.exchange([command])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


_runners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # client -> {name: Runner}
_runners_lock = threading.Lock()


def runner(client: redis.Redis, name: str) -> Runner:
    """The client's Runner of the script, made at the first call (a worker takes and answers every
    batch with one)."""
    with _runners_lock:
        made = _runners.setdefault(client, {})
        if name not in made:
            made[name] = Runner(client, name)
        return made[name]
