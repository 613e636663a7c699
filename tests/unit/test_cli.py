"""The console scripts pyproject.toml declares, as installed into this environment."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from funnel.common import settings
from funnel.scripts import cli, entry, stack
from funnel.scripts.entry import PREPARE, WEB, WORKER
from funnel.worker.settings import WorkerSettings
from tests.support import ROOT

BIN = Path(sys.executable).parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_funnel_command_answers_help(command):
    done = run(str(BIN / "funnel"), command, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.parametrize("script", ["funnel-web", "funnel-worker", "funnel-client"])
def test_tier_scripts_answer_help(script):
    done = run(str(BIN / script), "--help")
    assert done.returncode == 0, done.stderr
    assert "FUNNEL_" in done.stdout or "usage:" in done.stdout


def test_unknown_command_is_refused_with_the_list():
    done = run(str(BIN / "funnel"), "serve")
    assert done.returncode == 2
    assert "unknown command 'serve'" in done.stderr and "inspect" in done.stderr


def test_nothing_edits_sys_path():
    """Imports come from the installed package; no module may reach around it."""
    offenders = []
    for folder in ("common", "web", "worker", "scripts", "client", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(__file__):  # this test names what it looks for
                continue
            text = path.read_text()
            if "sys.path.insert" in text or "sys.path.append" in text or "sys.path[0] =" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_which_finds_the_installed_scripts():
    assert shutil.which("funnel", path=str(BIN)) and shutil.which("funnel-web", path=str(BIN))


def test_every_funnel_up_option_says_what_it_does_and_its_default():
    for action in stack.options({})._actions:
        if action.dest == "help":
            continue
        assert action.help and len(action.help) > 40, action.option_strings
        assert "default" in action.help, action.option_strings
    done = run(str(BIN / "funnel"), "up", "--help")
    assert "--batch-size" in done.stdout and "--linger-ms" in done.stdout


def a_store(tmp_path: Path, *models: str) -> Path:
    """A model store with these model names, enough for funnel up to list them (nothing is loaded)."""
    for model in models:
        (tmp_path / model).mkdir()
        (tmp_path / model / "model.json").write_text("{}")
    return tmp_path


def worker_settings(up: stack.Stack) -> dict[str, WorkerSettings]:
    """What each worker `funnel up` would start reads from the environment it is given."""
    return {model: settings.load(WorkerSettings, [], environ=up.worker_environment(model))
            for model in up.worker_models}


def test_funnel_up_hands_batch_size_and_linger_to_its_workers(tmp_path):
    store = a_store(tmp_path, "image-classifier", "text-embedding")
    up = stack.build(["--model-store", str(store), "--batch-size", "8", "--linger-ms", "2.5", "--no-front-door"],
                     environ={})
    workers = worker_settings(up)
    assert sorted(workers) == ["image-classifier", "text-embedding"]
    for model, worker in workers.items():
        assert (worker.model, worker.batch_size, worker.linger_ms) == ([model], 8, 2.5)


def test_funnel_up_options_per_model_win_over_the_environment(tmp_path):
    store = a_store(tmp_path, "image-classifier", "text-embedding")
    environ = {"FUNNEL_BATCH_SIZE": "4", "FUNNEL_LINGER_MS": "7", "FUNNEL_BULK_SHARE": "0.5",
               "FUNNEL_WORKER_ID": "one-for-all", "FUNNEL_API_KEYS": "secret", "FUNNEL_THREADS": "3"}
    up = stack.build(["--model-store", str(store), "--batch-size", "text-embedding=64",
                      "--linger-ms", "image-classifier=1", "--no-front-door"], environ=environ)
    workers = worker_settings(up)
    assert (workers["text-embedding"].batch_size, workers["text-embedding"].linger_ms) == (64, 7.0)
    assert (workers["image-classifier"].batch_size, workers["image-classifier"].linger_ms) == (4, 1.0)
    assert {w.bulk_share for w in workers.values()} == {0.5}
    # Each worker's id is its own, whatever the environment says; web settings go to the web tier.
    assert "FUNNEL_WORKER_ID" not in up.worker_environment("text-embedding")
    assert "FUNNEL_THREADS" not in up.worker_environment("text-embedding")
    assert up.web_env == {"FUNNEL_API_KEYS": "secret", "FUNNEL_THREADS": "3"}


def test_funnel_up_serves_each_models_highest_version_and_a_worker_may_name_one(tmp_path):
    store = a_store(tmp_path, "image-classifier")
    for version in (1, 3):  # a versioned entry: its workers load the highest version at their start
        (tmp_path / "text-embedding" / str(version)).mkdir(parents=True)
        (tmp_path / "text-embedding" / str(version) / "model.json").write_text("{}")
    up = stack.build(["--model-store", str(store), "--batch-size", "text-embedding=8", "--no-front-door",
                      "--workers-per-model", "1"], environ={})
    assert up.models == up.worker_models == ["image-classifier", "text-embedding"]
    assert {m: w.model for m, w in worker_settings(up).items()} == {m: [m] for m in up.models}
    # NAME:N starts a worker of version N, with the model's own settings.
    pinned = settings.load(WorkerSettings, [], environ=up.worker_environment("text-embedding:1"))
    assert (pinned.model, pinned.batch_size) == (["text-embedding:1"], 8)
    assert stack.model_name("text-embedding:1") == "text-embedding"


def test_funnel_traffic_reads_version_weight_pairs():
    from funnel.scripts.traffic import parse_weights

    assert parse_weights(["1=90", "2=10"]) == {1: 90, 2: 10}
    for bad in (["1"], ["=5"], ["1="], ["1=5", "1=6"], ["0=5"], ["1=0"], ["1=x"]):
        with pytest.raises(ValueError):
            parse_weights(bad)


def test_funnel_up_refuses_a_batch_size_for_a_model_it_does_not_serve(tmp_path):
    store = a_store(tmp_path, "text-embedding")
    with pytest.raises(SystemExit, match="resnet-50"):
        stack.build(["--model-store", str(store), "--batch-size", "resnet-50=8", "--no-front-door"], environ={})
    with pytest.raises(SystemExit):  # argparse: not a number
        stack.build(["--model-store", str(store), "--linger-ms", "soon", "--no-front-door"], environ={})


@pytest.mark.parametrize(("command", "extras", "expected"), [
    ("funnel-web", [WEB], "funnel-web needs the web extra: pip install 'funnel[web]'"),
    ("funnel-worker", [WORKER],
     "funnel-worker needs the worker extra: pip install 'funnel[worker]' ('funnel[gpu]' on CUDA hosts)"),
    ("funnel up", [WEB, WORKER], "funnel up needs the web and worker extras: "
                                 "pip install 'funnel[web,worker]' ('funnel[web,gpu]' on CUDA hosts)"),
])
def test_a_missing_extra_is_named_with_its_pip_command(command, extras, expected):
    assert entry.missing_message(command, extras) == expected


def test_a_module_missing_on_the_way_is_put_down_to_the_commands_own_extra_first():
    assert entry.extra_of("torch", first=(PREPARE,)) is PREPARE
    assert entry.extra_of("torch.nn", first=(WORKER,)) is WORKER
    assert entry.extra_of("transformers") is PREPARE
    assert entry.extra_of("numpy") is None  # a base dependency: no extra to name
    assert entry.missing_message("funnel add", [WORKER], "onnxruntime") == (
        "funnel add needs onnxruntime, from the worker extra: pip install 'funnel[worker]' "
        "('funnel[gpu]' on CUDA hosts)")


def test_a_command_whose_extra_is_missing_exits_2_before_importing_it(capsys):
    absent = entry.Extra("absent", ("funnel_no_such_module",))
    assert entry.run("funnel-thing", (absent,), "funnel_no_such_module.main") == 2
    assert capsys.readouterr().err == "funnel-thing needs the absent extra: pip install 'funnel[absent]'\n"
