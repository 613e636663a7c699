import threading
import time

import pytest

from funnel.worker.linger import CostModel, Linger


def test_cost_model_recovers_a_line():
    model = CostModel()
    for n in (1, 4, 8, 16, 32, 2, 24):
        model.add(n, 0.002 * n + 0.010)
    a, b = model.fit()
    assert a == pytest.approx(0.002, rel=1e-3) and b == pytest.approx(0.010, rel=1e-3)


def test_cost_model_fits_a_line_from_its_first_two_batches():
    """Two batches of different sizes are two points of the line: the weights' decay (their sum is
    1.98 after two) must not hold the fit back a third batch."""
    model = CostModel()
    model.add(1, 0.012)
    assert model.fit()[1] == 0.0
    model.add(16, 0.042)
    a, b = model.fit()
    assert a == pytest.approx(0.002, rel=1e-3) and b == pytest.approx(0.010, rel=1e-3)


def test_cost_model_with_one_size_has_no_fixed_cost():
    model = CostModel()
    model.add(1, 0.004)
    model.add(1, 0.004)
    assert model.fit() == (pytest.approx(0.004), 0.0)


def arrivals(rate_per_s: float, n: int = 50) -> list[int]:
    now = time.time()
    return [int((now - i / rate_per_s) * 1000) for i in range(n)]


def fitted(fixed_cost_s: float, max_linger_ms: float = 20, stop: threading.Event | None = None) -> Linger:
    linger = Linger(max_linger_ms, stop)
    for n in (1, 2, 4, 8):
        linger.observe((n, 0.001 * n + fixed_cost_s), [])
    return linger


def test_waits_when_the_next_job_comes_sooner_than_a_batch_costs():
    linger = fitted(fixed_cost_s=0.010)  # 10 ms per run
    linger.observe((0, 0), arrivals(1000))  # one job per ms
    assert 0 < linger.budget_s(held=1, batch_size=32) <= 0.020


def test_no_wait_at_low_load():
    linger = fitted(fixed_cost_s=0.002)
    linger.observe((0, 0), arrivals(20))  # one job per 50 ms, much slower than 2 ms
    assert linger.budget_s(held=1, batch_size=32) == 0


def test_no_wait_before_anything_is_known_or_when_full_or_stopping():
    assert Linger(20).budget_s(1, 32) == 0
    linger = fitted(fixed_cost_s=0.010)
    linger.observe((0, 0), arrivals(1000))
    assert linger.budget_s(held=32, batch_size=32) == 0
    linger.stop.set()
    assert linger.budget_s(held=1, batch_size=32) == 0


def test_never_longer_than_the_maximum():
    linger = fitted(fixed_cost_s=1.0)
    linger.observe((0, 0), arrivals(100))
    assert linger.budget_s(held=1, batch_size=1000) == pytest.approx(0.020)


def test_a_stop_request_runs_the_batch_in_hand_at_once():
    stop = threading.Event()
    linger = fitted(fixed_cost_s=1.0, stop=stop)
    linger.observe((0, 0), arrivals(100))
    assert linger.budget_s(held=1, batch_size=1000) == pytest.approx(0.020)
    stop.set()  # the worker's own stop event, set by SIGTERM
    assert linger.budget_s(held=1, batch_size=1000) == 0


def test_no_wait_with_a_zero_maximum():
    linger = fitted(fixed_cost_s=1.0, max_linger_ms=0)
    linger.observe((0, 0), arrivals(1000))
    assert linger.budget_s(held=1, batch_size=32) == 0


def test_a_batch_holding_what_one_fixed_cost_sees_arrive_runs_at_once():
    """At one item a ms and a 10 ms fixed cost, about ten items arrive within one run's fixed cost:
    a batch of fewer waits for them, one of ten or more would only idle the model."""
    linger = fitted(fixed_cost_s=0.010)
    linger.observe((0, 0), arrivals(1000))
    assert linger.budget_s(held=3, batch_size=32) > 0
    assert linger.budget_s(held=12, batch_size=32) == 0
