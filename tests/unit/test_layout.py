"""What `funnel up` starts when not told: workers per model and their threads, per host (scripts/layout.py)."""

from __future__ import annotations

import os

import pytest

from funnel.common import settings
from funnel.scripts import layout, stack
from funnel.scripts.layout import Layout
from funnel.worker.settings import WorkerSettings, thread_count


@pytest.mark.parametrize(("cores", "expected"), [
    # nothing to share: the library's threads, spinning within a run
    (1, Layout(workers_per_model=1, threads=0, spinning=True)),
    (2, Layout(workers_per_model=2, threads=1, spinning=False)),
    (3, Layout(workers_per_model=2, threads=1, spinning=False)),
    (16, Layout(workers_per_model=2, threads=8, spinning=False)),
])
def test_a_cpu_host_gets_two_workers_sharing_its_cores(cores, expected):
    assert layout.choose(cores, "cpu") == expected


@pytest.mark.parametrize("device", ["cuda:0", "auto"])
def test_a_gpu_worker_stays_one_process(device):
    assert layout.choose(16, device) == Layout(workers_per_model=1, threads=0, spinning=True)


def test_workers_the_user_names_share_the_cores():
    assert layout.choose(16, "cpu", 4) == Layout(workers_per_model=4, threads=4, spinning=False)
    assert layout.choose(2, "cpu", 1) == Layout(workers_per_model=1, threads=0, spinning=True)
    assert layout.choose(2, "cuda:0", 3) == Layout(workers_per_model=3, threads=1, spinning=False)


def test_funnel_up_starts_the_layout_and_says_what_it_chose(model_store, monkeypatch):
    monkeypatch.setattr(layout, "cores", lambda: 2)
    up = stack.build(["--model-store", str(model_store), "--no-front-door"], environ={})
    assert up.layout == Layout(workers_per_model=2, threads=1, spinning=False)
    assert len(up.worker_models) == 2 * len(up.models)
    env = up.worker_environment(up.models[0])
    assert (env["FUNNEL_INTRA_OP_THREADS"], env["FUNNEL_SPINNING"]) == ("1/2", "0")  # counted where each runs
    assert env["FUNNEL_CORE_LOCK"] == layout.core_lock()  # one for every worker of this user on the host
    assert settings.load(WorkerSettings, [], environ=env).threads() == max(1, len(os.sched_getaffinity(0)) // 2)
    assert up.layout.describe(2, "cpu", 2) == ("2 cores, models on cpu: 2 web processes, 2 workers per model "
                                                "(1 model thread each, not spin-waiting, a lone item on all the cores)")


def test_the_users_settings_win_and_are_what_funnel_up_says(model_store, monkeypatch):
    monkeypatch.setattr(layout, "cores", lambda: 2)
    up = stack.build(["--model-store", str(model_store), "--no-front-door", "--workers-per-model", "1"],
                     environ={"FUNNEL_INTRA_OP_THREADS": "2"})
    assert up.layout == Layout(workers_per_model=1, threads=2, spinning=True)
    assert len(up.worker_models) == len(up.models)
    assert up.worker_environment(up.models[0])["FUNNEL_INTRA_OP_THREADS"] == "2"
    on_gpu = stack.build(["--model-store", str(model_store), "--no-front-door"], environ={"FUNNEL_DEVICE": "cuda:0"})
    assert on_gpu.layout == Layout(workers_per_model=1, threads=0, spinning=True)
    assert "FUNNEL_INTRA_OP_THREADS" not in on_gpu.worker_environment("x")


@pytest.mark.parametrize(("text", "cores", "threads"), [("0", 8, 0), ("3", 8, 3), ("1/2", 8, 4), ("1/3", 8, 2),
                                                        ("1/2", 1, 1), ("1/1", 2, 2)])
def test_a_workers_threads_are_a_number_or_its_share_of_the_cores(text, cores, threads):
    assert thread_count(text, cores) == threads


@pytest.mark.parametrize("text", ["1/0", "-1", "half", "2/3", "1/"])
def test_anything_else_stops_the_worker_with_a_message(text):
    with pytest.raises(SystemExit, match="intra-op-threads"):
        WorkerSettings.load(["--model", "text-embedding", "--intra-op-threads", text])


def test_a_core_lock_the_user_turns_off_is_not_claimed(model_store, monkeypatch):
    monkeypatch.setattr(layout, "cores", lambda: 2)
    up = stack.build(["--model-store", str(model_store), "--no-front-door"], environ={"FUNNEL_CORE_LOCK": ""})
    assert up.worker_environment(up.models[0])["FUNNEL_CORE_LOCK"] == ""
    assert up.layout.describe(2, "cpu", 2).endswith("(1 model thread each, not spin-waiting)")
