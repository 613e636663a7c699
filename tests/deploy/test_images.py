"""What can be checked of the images without building them (test_containers.py builds them).

Every file a Dockerfile COPYs from the build context exists and is not cut
out of the context by .dockerignore, which lets in what `pip install .` needs
and nothing heavy; the Dockerfiles use nothing the classic builder lacks; every
base image is a build argument that the Compose files pass through from the
environment, with the same defaults; the targets the Compose files and the
Kubernetes manifests name exist.
"""

from __future__ import annotations

import re
import shlex

import pytest

from tests.deploy.support import COMPOSE_FILES, ROOT, dockerfile_stages, load_compose

DOCKERFILES = ["deploy/Dockerfile.web", "deploy/Dockerfile.worker"]


def ignore_patterns() -> list[tuple[re.Pattern, bool]]:
    """.dockerignore's patterns (Go filepath.Match, plus ** for any number of folders), each with
    whether it is an exception ("!pattern": let back in)."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?|\[[^\]]*\])", line.lstrip("!").strip("/")):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, part if part.startswith("[") else re.escape(part))
        patterns.append((re.compile(regex + "$"), exception))
    return patterns


def ignored(path: str, patterns: list[tuple[re.Pattern, bool]]) -> bool:
    """As Docker decides: the last pattern that matches the path or a folder above it wins."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    verdict = False
    for pattern, exception in patterns:
        if any(pattern.match(p) for p in prefixes):
            verdict = not exception
    return verdict


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
                 ".git/HEAD", "worker/__pycache__/main.cpython-311.pyc", "benchmarks/bench.py",
                 "client/pyproject.toml", "docs/deployment.md", "deploy/k8s/web.yaml",
                 "docker-compose.yml", "run/containers/build-web.log", "funnel.egg-info/PKG-INFO"):
        assert ignored(path, patterns), path


def test_dockerignore_lets_in_what_pip_install_needs():
    """pyproject.toml, its readme and every folder it maps to a package, whole."""
    import tomllib

    patterns = ignore_patterns()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = ["pyproject.toml", project["project"]["readme"]]
    for folder in project["tool"]["setuptools"]["package-dir"].values():
        needed += [f.relative_to(ROOT).as_posix() for f in (ROOT / folder).rglob("*")
                   if f.is_file() and "__pycache__" not in f.parts and not f.name.endswith(".pyc")]
    assert len(needed) > 20
    assert not [path for path in needed if ignored(path, patterns)]


def test_ignore_rules_follow_docker():
    rules = [(re.compile(r"[^/]*$"), False), (re.compile(r"web$"), True),
             (re.compile(r"(?:.*/)?__pycache__$"), False)]
    assert ignored("tests/x.py", rules) and not ignored("web/app.py", rules)
    assert ignored("web/__pycache__/app.pyc", rules)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfiles_build_with_the_classic_builder(dockerfile):
    """No registry here, so no BuildKit frontend image: nothing that only a frontend has."""
    text = (ROOT / dockerfile).read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M), "a # syntax= line pulls a frontend image"
    for line in text.splitlines():
        word = line.split(" ", 1)[0].upper()
        if word in ("COPY", "ADD", "RUN"):
            assert "<<" not in line, f"heredoc: {line}"
            assert "--mount" not in line and "--link" not in line and "--chmod" not in line, line


def dockerfile_args(dockerfile: str) -> dict[str, str]:
    """The global ARGs (before the first FROM) and their defaults."""
    found = {}
    for line in (ROOT / dockerfile).read_text().splitlines():
        if line.startswith("FROM "):
            break
        if line.startswith("ARG "):
            name, _, default = line[4:].strip().partition("=")
            found[name] = default
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_base_image_is_a_build_argument(dockerfile):
    args = dockerfile_args(dockerfile)
    stages: list[str] = []
    for line in (ROOT / dockerfile).read_text().splitlines():
        if line.startswith("FROM "):
            parts = line.split()
            base = parts[1]
            assert base in stages or base == "scratch" or re.fullmatch(r"\$\{(\w+)\}", base), line
            if base.startswith("${"):
                assert base[2:-1] in args and args[base[2:-1]], f"{base} needs a default ARG"
            stages.append(parts[3] if len(parts) > 3 else "")
        for match in re.finditer(r"COPY --from=(\S+)", line):
            assert match[1] in stages, f"COPY --from names an image, not a stage: {line}"


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_passes_the_base_images_through(name):
    """From the environment, else the Dockerfiles' own defaults (the official images)."""
    defaults = {**dockerfile_args("deploy/Dockerfile.web"), **dockerfile_args("deploy/Dockerfile.worker")}
    services = load_compose(name, {})["services"]
    assert services["redis"]["image"] == "redis:7.4.5"
    assert load_compose(name, {"REDIS_IMAGE": "mirror/redis:7"})["services"]["redis"]["image"] == \
        "mirror/redis:7"
    for service in ("web", "worker-image", "worker-text"):
        build = services[service]["build"]
        declared = dockerfile_args(build["dockerfile"])
        assert set(build["args"]) == set(declared), service  # each one, and no unused ones
        for arg in declared:
            assert build["args"][arg] == defaults[arg], (service, arg)
        mirror = {"PYTHON_IMAGE": "mirror/python:3.11", "CUDA_IMAGE": "mirror/cuda"}
        args = load_compose(name, mirror)["services"][service]["build"]["args"]
        for arg, image in mirror.items():
            assert args.get(arg, image) == image, (service, arg)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_build_targets_exist(name):
    for service, config in load_compose(name, {})["services"].items():
        build = config.get("build")
        if build:
            stages = dockerfile_stages(ROOT / build["dockerfile"])
            assert build.get("target") is None or build["target"] in stages, (service, build)
