"""What can be checked of the images without building them (there is no Docker engine here).

Every file a Dockerfile COPYs from the build context exists and is not cut
out of the context by .dockerignore; the targets the Compose files and the
Kubernetes manifests name exist.
"""

from __future__ import annotations

import re
import shlex

import pytest

from tests.deploy.support import COMPOSE_FILES, ROOT, dockerfile_stages, load_compose

DOCKERFILES = ["deploy/Dockerfile.web", "deploy/Dockerfile.worker"]


def ignore_patterns() -> list[re.Pattern]:
    """.dockerignore's patterns (Go filepath.Match, plus ** for any number of folders)."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "exceptions are not handled here"
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?|\[[^\]]*\])", line.strip("/")):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, part if part.startswith("[") else re.escape(part))
        patterns.append(re.compile(regex + "$"))
    return patterns


def ignored(path: str, patterns: list[re.Pattern]) -> bool:
    parts = path.strip("/").split("/")
    return any(p.match("/".join(parts[:i])) for p in patterns for i in range(1, len(parts) + 1))


def copied_sources(dockerfile: str) -> list[str]:
    sources = []
    for line in (ROOT / dockerfile).read_text().splitlines():
        if not line.startswith("COPY ") or "<<" in line:
            continue
        tokens = shlex.split(line[5:])
        if any(t.startswith("--from") for t in tokens):  # from another stage, not the context
            continue
        sources += [t for t in tokens if not t.startswith("--")][:-1]
    return sources


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_copied_files_are_in_the_build_context(dockerfile):
    patterns = ignore_patterns()
    sources = copied_sources(dockerfile)
    assert sources
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"{dockerfile} copies {source}, which does not exist"
        assert not ignored(source, patterns), f"{dockerfile} copies {source}, which .dockerignore drops"
        for file in (path.rglob("*.py") if path.is_dir() else []):
            relative = file.relative_to(ROOT).as_posix()
            if "__pycache__" not in relative:
                assert not ignored(relative, patterns), f".dockerignore drops {relative}"


def test_dockerignore_keeps_the_heavy_things_out():
    patterns = ignore_patterns()
    for path in (".venv/bin/python", "model_store/text-embedding/model.onnx", "tests/conftest.py",
                 ".git/HEAD", "worker/__pycache__/main.cpython-311.pyc"):
        assert ignored(path, patterns), path


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_build_targets_exist(name):
    for service, config in load_compose(name, {})["services"].items():
        build = config.get("build")
        if build:
            stages = dockerfile_stages(ROOT / build["dockerfile"])
            assert build.get("target") is None or build["target"] in stages, (service, build)
