"""The Lua scripts' home (common/link/lua/, common/link/lua_scripts.py): every script compiles in a real
Redis, its header names every KEYS[i] and ARGV[i] it reads and what it returns, snippets are
included, and the files ship in the package."""

from __future__ import annotations

import fnmatch
import re
import tomllib

import pytest
import redis

from funnel.common.link import lua_scripts
from tests.support import ROOT

SNIPPETS = {"webhook_due", "in_flight"}  # functions for other scripts, not scripts of their own
SCRIPTS = sorted(set(lua_scripts.names()) - SNIPPETS)
HEADER_ENTRY = re.compile(r"^-- (KEYS|ARGV)\[(\d+)(\.\.[^\]]*)?\]", re.MULTILINE)


def header_and_body(name: str) -> tuple[str, str]:
    """A file's opening comment block, and the rest."""
    lines = (lua_scripts.HOME / f"{name}.lua").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    return "\n".join(lines[:cut]), "\n".join(lines[cut:])


def test_every_script_and_snippet_has_a_file():
    assert SCRIPTS == ["batch_describe", "cancel", "choose_device", "leave", "load_claim", "push", "recovery_claim",
                       "release", "reply", "step_push", "store_results", "take", "webhook_claim", "webhook_lease",
                       "webhook_settle"]
    assert set(lua_scripts.names()) >= SNIPPETS


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_compiles_in_redis(redis_client, name):
    sha = redis_client.script_load(lua_scripts.source(name))
    assert redis_client.script_exists(sha) == [True]


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_header_names_every_key_and_argument_it_reads(name):
    header, body = header_and_body(name)
    assert header.startswith(f"-- {name}.lua: "), "the header opens with the file's name and what it does"
    assert re.search(r"^-- Returns\b", header, re.MULTILINE), "the header says what it returns"
    named: dict[str, set[int]] = {"KEYS": set(), "ARGV": set()}
    open_from: dict[str, int] = {}  # KEYS[n..]: every index from n on
    for kind, index, span in HEADER_ENTRY.findall(header):
        if span:
            open_from[kind] = min(open_from.get(kind, 1 << 30), int(index))
        else:
            named[kind].add(int(index))
    for kind in ("KEYS", "ARGV"):
        used = {int(i) for i in re.findall(rf"\b{kind}\[(\d+)\]", body)}
        missing = {i for i in used if i not in named[kind] and i < open_from.get(kind, 1 << 30)}
        assert not missing, f"{kind}{sorted(missing)} used but not in the header"
        listed = named[kind] | ({open_from[kind]} if kind in open_from else set())
        assert listed == set(range(1, max(listed, default=0) + 1)), f"{kind} entries skip an index"
        computed = re.search(rf"#{kind}\b|unpack\({kind}|\b{kind}\[[a-z]", body)
        assert not computed or kind in open_from, f"{kind} read at computed indices needs a KEYS[n..] entry"


@pytest.mark.parametrize(("snippet", "function", "users"), [
    ("webhook_due", "webhook_due", ("cancel", "store_results")),
    ("in_flight", "taken_message", ("reply", "store_results"))])
def test_an_included_snippet_comes_first_once(snippet, function, users):
    for name in users:
        text = lua_scripts.source(name)
        assert text.index(lua_scripts.source(snippet)) < text.index((lua_scripts.HOME / f"{name}.lua").read_text())
        assert text.count(f"local function {function}") == 1
    header, body = header_and_body(snippet)
    assert not re.search(r"\b(KEYS|ARGV)\[", body), "a snippet takes its keys as arguments"


def test_the_lua_files_ship_in_the_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"]["funnel.common"] == "common"
    assert "funnel.common.link" in config["packages"]
    patterns = config["package-data"]["funnel.common.link"]
    for path in lua_scripts.HOME.glob("*.lua"):
        relative = path.relative_to(ROOT / "common" / "link").as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative


def test_a_runner_runs_its_script_on_its_thread_line_and_loads_it_again_after_a_flush(redis_client):
    """The worker's take and reply (lua_scripts.Runner): EVALSHA on the calling thread's own
    connection, loaded again when Redis forgot the script (a restart, a SCRIPT FLUSH), and a
    script's own error raised, not answered."""
    take = lua_scripts.runner(redis_client, "take")
    assert lua_scripts.runner(redis_client, "take") is take  # made once per client
    lanes = [f"funnel:{lane}:{{m}}:1" for lane in ("queue-high", "queue", "queue-low", "bulk")]
    redis_client.lpush(lanes[1], b"job-1", b"job-2")
    args = [4, 0, 0, 0, 0, 4, 4, 4, 4]  # four items at most, no places kept, every lane's cap four
    counts, jobs, left, held = take(["funnel:inflight:{m}:w1", "funnel:gone:{m}", *lanes], args)
    assert (counts, jobs, left, held) == ([0, 2, 0, 0], [b"job-1", b"job-2"], [], 2)
    redis_client.script_flush()
    redis_client.lpush(lanes[1], b"job-3")
    assert take(["funnel:inflight:{m}:w1", "funnel:gone:{m}", *lanes], args)[1] == [b"job-3"]
    with pytest.raises(redis.ResponseError):
        take(["funnel:inflight:{m}:w1", "funnel:gone:{m}", *lanes], ["not a number"])


def test_a_runner_is_forgotten_with_its_client(redis_server):
    """The runners' cache holds clients weakly, and a runner holds its client's pool, not the
    client: a client dropped takes its runners (and their lines) with it."""
    import gc
    import weakref

    client = redis.Redis.from_url(redis_server.url)
    made = weakref.ref(lua_scripts.runner(client, "reply"))
    gone = weakref.ref(client)
    client.close()
    del client
    gc.collect()
    assert gone() is None and made() is None
