"""Funnel as pip installs it: wheels built from this tree, installed into fresh virtual environments.

The server's wheel with no extra names, for each tier's command, the extra
to install; with its `web` extra added it serves a real request (a worker
from the development environment answers it); the client's wheel works
alone, without any of the server's packages.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from funnel.scripts.redis_local import LocalRedis, free_port
from funnel.scripts.stack import Stack
from tests.support import ROOT, http

BIN = Path(sys.executable).parent


def run(*args, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    for source in (ROOT, ROOT / "client"):
        # --no-build-isolation: setuptools is in this environment; no index needed to build.
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source)
    found = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    assert set(found) == {"funnel", "funnel_client"}, found
    return found


def fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin"


def test_the_server_wheel_holds_the_packages_their_files_and_scripts(wheels):
    names = zipfile.ZipFile(wheels["funnel"]).namelist()
    for expected in ("funnel/common/tasks/base.py", "funnel/web/app.py", "funnel/worker/main.py",
                     "funnel/scripts/cli.py", "funnel/web/openapi.json", "funnel/web/static/funnel.js",
                     "funnel/web/templates/index.html"):
        assert expected in names, expected
    # Every package of the source tree, and the Lua scripts: a subpackage missing from pyproject.toml's
    # list would be left out of the wheel while the editable install hides it.
    for package in ("common", "web", "worker", "scripts"):
        for found in (ROOT / package).rglob("*"):
            if found.name == "__init__.py" or found.suffix == ".lua":
                assert f"funnel/{found.relative_to(ROOT).as_posix()}" in names, found
    assert not [n for n in names if n.startswith(("tests/", "common/", "web/", "worker/", "benchmarks/"))]
    entry_points = next(zipfile.ZipFile(wheels["funnel"]).read(n).decode() for n in names
                        if n.endswith("entry_points.txt"))
    for line in ("funnel = funnel.scripts.cli:main", "funnel-web = funnel.scripts.entry:web",
                 "funnel-worker = funnel.scripts.entry:worker",
                 "image_classification = funnel.common.tasks.image_classification:ImageClassification"):
        assert line in entry_points, line


def test_the_client_installs_alone(wheels, tmp_path):
    bin_dir = fresh_venv(tmp_path / "venv")
    run(bin_dir / "pip", "install", "-q", "--no-index", wheels["funnel_client"])
    done = run(bin_dir / "python", "-c", "import importlib.util, funnel_client; "
               "print(funnel_client.Client('http://127.0.0.1:1').url, importlib.util.find_spec('funnel'))")
    assert done.stdout.split() == ["http://127.0.0.1:1", "None"]
    assert "usage: funnel-client" in run(bin_dir / "funnel-client", "--help").stdout


def answer(*args) -> subprocess.CompletedProcess:
    """A command's exit status and output, whatever the status."""
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def bare_install(wheels, tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    """`pip install funnel`, no extra, in a fresh environment, and what each command answers there.

    The answers are taken at once: the web extra's test adds its extra to this same environment
    afterwards, so the suite builds one environment for both.
    """
    folder = tmp_path_factory.mktemp("server")
    bin_dir = fresh_venv(folder / "venv")
    run(bin_dir / "pip", "install", "-q", wheels["funnel"])  # redis[hiredis], msgpack, numpy from the index
    (folder / "model.onnx").write_bytes(b"")  # `funnel add` reaches for onnxruntime before reading it
    commands = {"funnel-web": ["funnel-web"], "funnel-worker": ["funnel-worker", "--model", "text-embedding"],
                "funnel up": ["funnel", "up"], "funnel prepare": ["funnel", "prepare"],
                "funnel web": ["funnel", "web", "--help"], "funnel inspect": ["funnel", "inspect", "--help"],
                "funnel add": ["funnel", "add", "mine", "--task", "text_embedding", "--onnx", folder / "model.onnx",
                               "--store", folder / "store"],
                "funnel client": ["funnel", "client", "--help"]}
    return bin_dir, {name: answer(bin_dir / argv[0], *argv[1:]) for name, argv in commands.items()}


WITHOUT_EXTRAS = {
    "funnel-web": "funnel-web needs the web extra: pip install 'funnel[web]'",
    "funnel-worker": "funnel-worker needs the worker extra: pip install 'funnel[worker]' ('funnel[gpu]' on CUDA hosts)",
    "funnel up": "funnel up needs the web and worker extras: pip install 'funnel[web,worker]' "
                 "('funnel[web,gpu]' on CUDA hosts)",
    "funnel prepare": "funnel prepare needs the prepare extra: pip install 'funnel[prepare]'",
    "funnel web": "funnel web needs the web extra: pip install 'funnel[web]'",
    # needed only when the model comes as ONNX, so found when it is first imported
    "funnel add": "funnel add needs onnxruntime, from the worker extra: pip install 'funnel[worker]' "
                  "('funnel[gpu]' on CUDA hosts)",
    "funnel client": "funnel client needs the client, a distribution of its own: pip install ./client "
                     "(from Funnel's source)",
}


@pytest.mark.parametrize("command", list(WITHOUT_EXTRAS))
def test_without_its_extra_a_command_names_the_extra_and_exits_2(bare_install, command):
    done = bare_install[1][command]
    assert (done.returncode, done.stderr, done.stdout) == (2, WITHOUT_EXTRAS[command] + "\n", ""), done.stderr[-2000:]


def test_without_extras_the_commands_needing_none_still_run(bare_install):
    done = bare_install[1]["funnel inspect"]
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_the_web_extra_alone_serves_a_request(bare_install, wheels, model_store):
    """pip install 'funnel[web]' in a fresh environment: its funnel-web answers through Redis."""
    bin_dir, _ = bare_install
    run(bin_dir / "pip", "install", "-q", f"{wheels['funnel']}[web]")
    for command in (["funnel", "--help"], ["funnel", "inspect", "--help"], ["funnel-web", "--help"]):
        run(bin_dir / command[0], *command[1:])
    imported = run(bin_dir / "python", "-c", "import importlib.util as u; "
                   "print([m for m in ('torch', 'onnxruntime') if u.find_spec(m)])").stdout
    assert imported.strip() == "[]"  # the web extra brings no model runtime
    worker = answer(bin_dir / "funnel-worker", "--model", "text-embedding")
    assert worker.returncode == 2 and "needs the worker extra" in worker.stderr, worker.stderr[-2000:]
    up = answer(bin_dir / "funnel", "up")
    assert up.returncode == 2 and "funnel up needs the worker extra" in up.stderr, up.stderr[-2000:]
    port = free_port()
    with LocalRedis() as redis_server:
        stack = Stack(redis_url=redis_server.url, model_store=model_store, models=["text-embedding"])
        stack.start_worker("text-embedding")
        web = subprocess.Popen([bin_dir / "funnel-web", "--port", str(port), "--processes", "1",
                                "--redis-url", redis_server.url, "--model-store", str(model_store),
                                "--models", "text-embedding"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        stack.web, stack.port = web, port
        try:
            stack.wait_ready(60)
            status, body, _ = http("POST", f"{stack.url}/v1/models/text-embedding/predict",
                                   json_body={"text": "A man is eating food."})
            assert status == 200 and len(body["embedding"]) == 384, json.dumps(body)[:300]
        finally:
            stack.stop()
