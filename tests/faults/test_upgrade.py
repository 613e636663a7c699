"""Rolling upgrades: the release before this one and this one serve side by side, in either order of
upgrade, under load, with nothing lost, dead-lettered or answered twice (docs/deployment.md,
"Upgrading").

"The release before" is the newest release whose version is lower than pyproject.toml's `version`
(`release_before`): the commit of the newest git tag `vX.Y.Z` below that version; where the clone
holds no such tag, the last commit whose pyproject.toml had the highest version below it (the
parent of the commit that moved the version on), which is where that release's tag is made. Its
packages are checked out beside the code, on the PYTHONPATH of the processes that run it, ahead of
the installed ones. Each scenario starts one tier of each release, sends /v1 requests of one and of
several texts from clients that never stop, and a bulk job, then completes the upgrade as an
orchestrator would: a worker of the new release starts beside the old one, which then gets SIGTERM;
or a web tier of the new release starts on another port, the clients move to it, and the old one
gets SIGTERM. The processes keep the job ledger (benchmarks/ledger.py): every job Redis
acknowledged is answered once, and every answer is right.
"""

from __future__ import annotations

import re
import subprocess
import threading
import tomllib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import redis
from packaging.version import InvalidVersion, Version

from benchmarks import ledger
from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from tests.support import TEXT, http, texts, wait_for

ROOT = Path(__file__).resolve().parents[2]
RELEASE_TAG = re.compile(r"v(\d+\.\d+\.\d+)")  # how a release is tagged: v0.2.0
PACKAGES = ("common", "web", "worker", "scripts")  # funnel.<name>, as pyproject.toml maps them
CLIENTS = 4
SENTENCES = texts(24, "upgrade")
BULK = texts(120, "upgrade bulk")


class Release(NamedTuple):
    version: Version
    commit: str  # the full hash
    found_by: str  # "tag v0.2.0", or "history" where no tag was found


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def version_of(pyproject: str) -> Version | None:
    """The `version` of a pyproject.toml's text; None where it has none, or none that parses."""
    try:
        return Version(tomllib.loads(pyproject)["project"]["version"])
    except (tomllib.TOMLDecodeError, KeyError, TypeError, InvalidVersion):
        return None


def tagged_releases(root: Path) -> dict[Version, str]:
    """Each tag vX.Y.Z's version and the commit it names (annotated tags peeled)."""
    refs = git(root, "for-each-ref", "--format=%(refname:strip=2) %(objectname) %(*objectname)", "refs/tags/")
    releases = {}
    for line in refs.splitlines():
        name, target, *peeled = line.split()
        if RELEASE_TAG.fullmatch(name):
            releases[Version(name[1:])] = peeled[0] if peeled else target
    return releases


def release_in_history(root: Path, below: Version) -> Release | None:
    """The release before `below` as the history of pyproject.toml defines it: of the versions its
    commits had (first parents), the highest below `below`; that release is the last commit with
    it, the parent of the commit that changed the version, or HEAD when none has yet."""
    commits = git(root, "log", "--first-parent", "--format=%H", "--", "pyproject.toml").split()  # newest first
    versions = [version_of(git(root, "show", f"{sha}:pyproject.toml")) for sha in commits]
    older = [v for v in versions if v is not None and v < below]
    if not older:
        return None
    wanted = max(older)
    newest = versions.index(wanted)  # the newest commit that had it; the one before it in the list moved on
    last = f"{commits[newest - 1]}^" if newest else "HEAD"
    return Release(wanted, git(root, "rev-parse", "--verify", f"{last}^{{commit}}").strip(), "history")


def release_before(root: Path = ROOT) -> Release | None:
    """The release before the version in `root`'s pyproject.toml: the newest tag vX.Y.Z below it,
    else (a clone without tags) the release as the history of pyproject.toml defines it."""
    current = version_of((root / "pyproject.toml").read_text())
    if current is None:
        raise ValueError(f"{root / 'pyproject.toml'} has no version")
    tagged = {version: commit for version, commit in tagged_releases(root).items() if version < current}
    if tagged:
        newest = max(tagged)
        return Release(newest, tagged[newest], f"tag v{newest}")
    return release_in_history(root, current)


def shallow() -> bool:
    return git(ROOT, "rev-parse", "--is-shallow-repository").strip() == "true"


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory) -> str:
    """A PYTHONPATH entry that imports funnel.* from the release before this one."""
    if shallow():
        pytest.skip("a shallow clone may hold no release before this one: git fetch --unshallow --tags")
    before = release_before()
    if before is None:
        pytest.skip("no release before this version")
    folder = tmp_path_factory.mktemp(f"release-{before.version}")
    tree, path = folder / "tree", folder / "path" / "funnel"
    tree.mkdir()
    path.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", before.commit, *PACKAGES], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for package in PACKAGES:
        (path / package).symlink_to(tree / package, target_is_directory=True)
    return str(path.parent)


def release_env(ledger_dir: Path, previous: str | None) -> dict[str, str]:
    """A process's environment: keeping the ledger, and running the release before when given."""
    env = ledger.environment(ledger_dir)
    if previous:
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{previous}"
    return env


class Clients:
    """CLIENTS threads sending /v1 requests to `url` (which may change) until stopped: one text, or
    three, each answer checked against the text's own embedding."""

    def __init__(self, url: str, expected: dict[str, np.ndarray]):
        self.url, self.expected = url, expected
        self.statuses: dict[int, int] = {}
        self.wrong = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(CLIENTS)]

    def __enter__(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in self._threads)

    @property
    def answered(self) -> int:
        with self._lock:
            return sum(self.statuses.values())

    def _run(self, client: int) -> None:
        sent = 0
        while not self._stop.is_set():
            sent += 1
            start = (client * 7 + sent) % len(SENTENCES)
            several = sent % 3 == 0
            batch = [SENTENCES[(start + k) % len(SENTENCES)] for k in range(3 if several else 1)]
            body = {"texts": batch} if several else {"text": batch[0]}
            status, answer, _ = http("POST", f"{self.url}/v1/models/{TEXT}/predict", json_body=body, timeout=60)
            right = True
            if status == 200:
                got = [r["embedding"] for r in answer["results"]] if several else [answer["embedding"]]
                right = len(got) == len(batch) and all(
                    np.allclose(g, self.expected[t], atol=1e-4) for g, t in zip(got, batch))
            with self._lock:
                self.statuses[status] = self.statuses.get(status, 0) + 1
                self.wrong += not right

    def wait_for_more(self, n: int) -> None:
        target = self.answered + n
        wait_for(lambda: self.answered >= target, timeout_s=60, what=f"{n} more answers")


def live_text_workers(client: redis.Redis) -> list[dict[str, str]]:
    return [w for w in registry.live_workers(client, Keys()) if w.get("model") == TEXT]


def roll_worker(stack: Stack, client: redis.Redis, old: subprocess.Popen, env: dict[str, str]) -> None:
    """A worker of the other release beside `old`, then SIGTERM to `old`, which answers what it holds."""
    stack.start_worker(TEXT, **env)
    wait_for(lambda: len(live_text_workers(client)) == 2, timeout_s=120, what="the new worker registered")
    old.terminate()
    assert old.wait(timeout=60) == 0


def roll_web(stack: Stack, clients: Clients, env: dict[str, str]) -> None:
    """A web tier of the other release on another port, the clients moved to it, SIGTERM to the old."""
    port = free_port()
    new_web = stack._spawn("web-rolled", ["funnel.web"], stack.web_environment(port, **env))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(url), timeout_s=120, what="the new web tier answering")
    old_web, stack.web = stack.web, new_web
    clients.url = url
    old_web.terminate()
    assert old_web.wait(timeout=60) == 0


def _answers(url: str) -> bool:
    try:
        return http("GET", f"{url}/healthz", timeout=2)[0] == 200
    except OSError:
        return False


def bulk_done(url: str, job_id: str) -> dict | None:
    status = http("GET", f"{url}/v1/jobs/{job_id}?limit={len(BULK)}")[1]
    return status if status.get("state") == "done" else None


@pytest.mark.parametrize("first", ["web", "workers"])
def test_a_rolling_upgrade_in_either_order_loses_nothing(first, previous_release, model_store, expected_embeddings,
                                                         tmp_path):
    """The release before serves both tiers; then `first`, the web tier or the worker, is replaced
    by this release's, then the other: between the two, each release's tier serves the other's."""
    expected = expected_embeddings(SENTENCES + BULK)
    book = tmp_path / "ledger"
    book.mkdir()
    old, new = release_env(book, previous_release), release_env(book, None)
    stack = Stack(model_store=model_store, models=[TEXT], workers=[], web_env=old, log_dir=tmp_path / "logs")
    with stack:
        client = redis.Redis.from_url(stack.redis_url)
        serving = stack.start_worker(TEXT, **old)
        stack.wait_ready(120, {TEXT: 1})
        code, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/jobs", json_body={"texts": BULK})
        assert code == 202, body
        with Clients(stack.url, expected) as clients:
            clients.wait_for_more(50)
            if first == "web":
                roll_web(stack, clients, new)
                clients.wait_for_more(100)  # this release's web tier, the release before's worker
                roll_worker(stack, client, serving, new)
            else:
                roll_worker(stack, client, serving, new)
                clients.wait_for_more(100)  # the release before's web tier, this release's worker
                roll_web(stack, clients, new)
            clients.wait_for_more(50)
        job = wait_for(lambda: bulk_done(clients.url, body["id"]), timeout_s=120, what="the bulk job done")
        assert len(job["results"]) == len(BULK)
        assert all(np.allclose(r["embedding"], expected[t], atol=1e-4) for r, t in zip(job["results"], BULK))
        dead = client.llen(Keys().dead(TEXT))
    book_read = ledger.read(book)
    logs = f"logs: {tmp_path / 'logs'}"
    assert clients.statuses == {200: clients.answered} and clients.wrong == 0, (clients.statuses, logs)
    assert dead == 0, logs
    assert book_read.queued and not book_read.lost, (len(book_read.lost), logs)
    assert not book_read.answered_twice, (book_read.answered_twice, logs)
    assert not book_read.expired and not book_read.left, logs
