"""Reading the deployment files as their tools would: Compose interpolation, Dockerfile stages."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import yaml

from tests.support import http

ROOT = Path(__file__).resolve().parent.parent.parent
COMPOSE_FILES = ["docker-compose.yml", "docker-compose.cpu.yml"]
K8S = ROOT / "deploy" / "k8s"

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message}, ${VAR?message}, $VAR; $$ is a "$".
_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")


def interpolate(text: str, environ: dict[str, str]) -> str:
    """Compose's variable substitution on one string."""
    def replace(match: re.Match) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["named"]
        value, op = environ.get(name), match["op"]
        if op in (":-", ":?") and not value:
            value = None
        if value is not None:
            return value
        if op and op.endswith("?"):
            raise ValueError(f"required variable {name} is unset: {match['arg']}")
        return match["arg"] if op else ""

    return _INTERPOLATION.sub(replace, text)


def variables(text: str) -> set[str]:
    """Every variable a Compose file's text interpolates."""
    return {m["braced"] or m["named"] for m in _INTERPOLATION.finditer(text) if not m["escaped"]}


def _walk(value, environ: dict[str, str]):
    if isinstance(value, str):
        return interpolate(value, environ)
    if isinstance(value, dict):
        return {k: _walk(v, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, environ) for v in value]
    return value


def load_compose(name: str, environ: dict[str, str]) -> dict:
    """A Compose file as its model: anchors merged, variables substituted, x- fields dropped."""
    raw = yaml.safe_load((ROOT / name).read_text())
    model = _walk({k: v for k, v in raw.items() if not k.startswith("x-")}, environ)
    for service in model["services"].values():
        env = service.get("environment") or {}
        if isinstance(env, list):  # KEY=VALUE form
            env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
        service["environment"] = {k: (None if v is None else str(v)) for k, v in env.items()}
    return model


@dataclasses.dataclass
class Stage:
    name: str
    base: str
    env: dict[str, str]
    cmd: list[str] | None
    healthcheck: list[str] | None


def dockerfile_stages(path: Path) -> dict[str, Stage]:
    """Stages of a Dockerfile by name (unnamed ones by index), with ENV, CMD and HEALTHCHECK.

    No heredocs: the classic builder has none (test_images.py checks).

    An unnamed target means the last stage: see `target_stage`.
    """
    lines = path.read_text().splitlines()
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):  # continuation
            nxt = lines[i]
            i += 1
            if nxt.lstrip().startswith("#"):
                continue
            line = line[:-1] + " " + nxt.strip()
        word, _, rest = line.strip().partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))
            parent = stages.get(parts[0])
            current = Stage(name, parts[0], dict(parent.env) if parent else {},
                            parent.cmd if parent else None, parent.healthcheck if parent else None)
            stages[name] = current
        elif current is None:
            continue
        elif word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                current.env[key] = value
        elif word == "CMD":
            current.cmd = _exec_form(rest)
        elif word == "HEALTHCHECK":
            _, _, cmd = rest.partition(" CMD ")
            current.healthcheck = _exec_form(cmd) if cmd else None
    return stages


def _exec_form(text: str) -> list[str]:
    import json

    text = text.strip()
    return json.loads(text) if text.startswith("[") else ["/bin/sh", "-c", text]


def target_stage(dockerfile: str, target: str | None) -> Stage:
    stages = dockerfile_stages(ROOT / dockerfile)
    return stages[target] if target else list(stages.values())[-1]


def setting_names() -> dict[str, set[str]]:
    """FUNNEL_* variables each tier reads: "FUNNEL_" + field name, upper-cased."""
    from funnel.common.settings import env_name
    from funnel.web.grpc.settings import GrpcSettings
    from funnel.web.settings import WebSettings
    from funnel.worker.settings import WorkerSettings

    return {tier: {env_name(f.name) for f in dataclasses.fields(cls) if f.init}
            for tier, cls in (("web", WebSettings), ("grpc", GrpcSettings), ("worker", WorkerSettings))}


def k8s_documents() -> dict[str, list[dict]]:
    """Every YAML file under deploy/k8s, its documents in order."""
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d]
            for p in sorted(K8S.glob("*.yaml"))}


def listing(url: str) -> dict[str, list[dict]]:
    """Served model -> its live workers, from a stack's GET /v1/models ({} while it does not answer)."""
    try:
        status, body, _ = http("GET", f"{url}/v1/models", timeout=5)
    except OSError:
        return {}
    return {m["name"]: m["workers"] for m in body.get("models", [])} if status == 200 else {}
