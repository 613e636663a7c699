"""The release before this one, as tests/faults/test_upgrade.py finds it: by tag, else by the history of
pyproject.toml, on a repository made here with real git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from tests.faults.test_upgrade import release_before

IDENTITY = ["-c", "user.name=Funnel", "-c", "user.email=funnel@example.invalid", "-c", "commit.gpgsign=false",
            "-c", "tag.gpgsign=false"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *IDENTITY, "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def commit(repo: Path, message: str, version: str | None = None) -> str:
    """A commit changing a file, and pyproject.toml's version where given; its full hash."""
    if version is not None:
        (repo / "pyproject.toml").write_text(f'[project]\nname = "funnel"\nversion = "{version}"\n')
    (repo / "notes.txt").write_text(message)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture()
def repo(tmp_path) -> dict[str, str]:
    """0.1.0 in two commits, 0.2.0 in three (its last beside the bump to 0.3.0), then 0.3.0 under
    way; the commits by name, the repository at "root"."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    commits = {"root": str(root)}
    commits["first"] = commit(root, "first", "0.1.0")
    commits["last 0.1.0"] = commit(root, "a fix")
    commits["bump 0.2.0"] = commit(root, "0.2.0 under way", "0.2.0")
    commits["middle 0.2.0"] = commit(root, "a feature")
    commits["last 0.2.0"] = commit(root, "another")
    commits["bump 0.3.0"] = commit(root, "0.3.0 under way", "0.3.0")
    commits["after"] = commit(root, "a rename")
    return commits


def test_without_tags_the_history_defines_the_release_before(repo):
    before = release_before(Path(repo["root"]))
    assert before is not None
    assert (before.version, before.commit, before.found_by) == (Version("0.2.0"), repo["last 0.2.0"], "history")


def test_the_newest_tag_below_the_version_is_the_release_before(repo):
    root = Path(repo["root"])
    git(root, "tag", "-a", "v0.1.0", "-m", "Funnel 0.1.0", repo["last 0.1.0"])
    git(root, "tag", "v0.2.0", repo["last 0.2.0"])  # a lightweight tag as well as annotated ones
    git(root, "tag", "-a", "v0.3.0", "-m", "not below 0.3.0", repo["after"])
    git(root, "tag", "-a", "v0.2.1-rc1", "-m", "not vX.Y.Z", repo["after"])
    git(root, "tag", "-a", "notes", "-m", "not a release", repo["after"])
    before = release_before(root)
    assert before is not None
    assert (before.version, before.commit, before.found_by) == (Version("0.2.0"), repo["last 0.2.0"], "tag v0.2.0")


def test_the_tag_and_the_history_agree(repo):
    root = Path(repo["root"])
    by_history = release_before(root)
    assert by_history is not None
    git(root, "tag", "-a", f"v{by_history.version}", "-m", "the release", by_history.commit)
    by_tag = release_before(root)
    assert by_tag is not None and by_tag.found_by == f"tag v{by_history.version}"
    assert (by_tag.version, by_tag.commit) == (by_history.version, by_history.commit)


def test_a_version_bumped_in_the_working_tree_only_makes_head_the_release_before(repo):
    """Before the bump is committed, the release before is the last commit: HEAD."""
    root = Path(repo["root"])
    (root / "pyproject.toml").write_text('[project]\nname = "funnel"\nversion = "0.4.0"\n')
    before = release_before(root)
    assert before is not None
    assert (before.version, before.commit) == (Version("0.3.0"), repo["after"])


def test_versions_compare_as_versions_not_as_text(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    nine = commit(root, "0.9.0", "0.9.0")
    commit(root, "0.10.0 under way", "0.10.0")
    git(root, "tag", "v0.9.0", nine)
    git(root, "tag", "v0.10.0", "HEAD")
    (root / "pyproject.toml").write_text('[project]\nname = "funnel"\nversion = "0.11.0"\n')
    before = release_before(root)
    assert before is not None and before.version == Version("0.10.0")


def test_the_first_release_has_none_before_it(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    commit(root, "first", "0.1.0")
    assert release_before(root) is None
