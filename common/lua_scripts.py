"""Funnel's Redis Lua scripts: one file each in common/lua/, read and registered from here.

Each file opens with a header naming every KEYS[i] and ARGV[i] it reads and what it returns. A
script that calls a shared snippet says so in a line `-- include: <file>.lua`; the snippet's text
is put before the script's (Lua needs a local function defined before it is called), so Redis
always runs one self-contained script. The files ship in the package (pyproject's package-data).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import redis
from redis.commands.core import Script

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
