"""What `funnel up` starts when not told: workers per model and their threads, per host (scripts/layout.py)."""

from __future__ import annotations

import pytest

from funnel.scripts import layout, stack
from funnel.scripts.layout import Layout


@pytest.mark.parametrize(("cores", "expected"), [
    (1, Layout(1, 0, True)),  # nothing to share: the library's threads, spinning within a run
    (2, Layout(2, 1, False)),
    (3, Layout(2, 1, False)),
    (16, Layout(2, 8, False)),
])
def test_a_cpu_host_gets_two_workers_sharing_its_cores(cores, expected):
    assert layout.choose(cores, "cpu") == expected


@pytest.mark.parametrize("device", ["cuda:0", "auto"])
def test_a_gpu_worker_stays_one_process(device):
    assert layout.choose(16, device) == Layout(1, 0, True)


def test_workers_the_user_names_share_the_cores():
    assert layout.choose(16, "cpu", 4) == Layout(4, 4, False)
    assert layout.choose(2, "cpu", 1) == Layout(1, 0, True)
    assert layout.choose(2, "cuda:0", 3) == Layout(3, 1, False)


def test_funnel_up_starts_the_layout_and_says_what_it_chose(model_store, monkeypatch):
    monkeypatch.setattr(layout, "cores", lambda: 2)
    up = stack.build(["--model-store", str(model_store), "--no-front-door"], environ={})
    assert up.layout == Layout(2, 1, False)
    assert len(up.worker_models) == 2 * len(up.models)
    env = up.worker_environment(up.models[0])
    assert (env["FUNNEL_INTRA_OP_THREADS"], env["FUNNEL_SPINNING"]) == ("1", "0")
    assert up.layout.describe(2, "cpu", 2) == ("2 cores, models on cpu: 2 web processes, 2 workers per model "
                                                "(1 model thread each, not spin-waiting)")


def test_the_users_settings_win_and_are_what_funnel_up_says(model_store, monkeypatch):
    monkeypatch.setattr(layout, "cores", lambda: 2)
    up = stack.build(["--model-store", str(model_store), "--no-front-door", "--workers-per-model", "1"],
                     environ={"FUNNEL_INTRA_OP_THREADS": "2"})
    assert up.layout == Layout(1, 2, True) and len(up.worker_models) == len(up.models)
    assert up.worker_environment(up.models[0])["FUNNEL_INTRA_OP_THREADS"] == "2"
    on_gpu = stack.build(["--model-store", str(model_store), "--no-front-door"], environ={"FUNNEL_DEVICE": "cuda:0"})
    assert on_gpu.layout == Layout(1, 0, True) and "FUNNEL_INTRA_OP_THREADS" not in on_gpu.worker_environment("x")
