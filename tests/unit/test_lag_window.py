"""The scheduling-lag window kept next to the lag histograms (``schedd.metrics``): quantiles
from bucket counts as Prometheus computes them, slots that age out of the window, and the
split by queue and priority (``schedd.api.views.lag_view``)."""

from __future__ import annotations

import pytest

from schedd.api.views import lag_view
from schedd.metrics import LAG_SLOT_S, LagWindow, Metrics, quantile

BOUNDS = (0.1, 0.5, 1.0)


def test_a_quantile_is_interpolated_in_its_bucket_like_histogram_quantile() -> None:
    # 10 at <= 0.1, 10 in (0.1, 0.5], none in (0.5, 1], none above
    counts = [10, 10, 0, 0]
    assert quantile(0.5, counts, BOUNDS) == pytest.approx(0.1)
    assert quantile(0.75, counts, BOUNDS) == pytest.approx(0.1 + 0.4 * 0.5)
    assert quantile(0.25, counts, BOUNDS) == pytest.approx(0.05)
    assert quantile(0.99, [0, 0, 0, 3], BOUNDS) == 1.0  # above every bound: the last bound
    assert quantile(0.5, [0, 0, 0, 0], BOUNDS) is None


def test_the_window_counts_only_its_slots_and_forgets_what_is_older_than_it_keeps() -> None:
    window = LagWindow(BOUNDS, keep_s=60)
    t0 = 10_000.0
    window.observe(0.05, "q", "high", t0)
    window.observe(0.7, "q", "high", t0 + LAG_SLOT_S)
    window.observe(5.0, "r", "low", t0 + 3 * LAG_SLOT_S)
    now = t0 + 3 * LAG_SLOT_S
    assert window.counts(LAG_SLOT_S, now) == {("r", "low"): [0, 0, 0, 1]}
    assert window.counts(3 * LAG_SLOT_S, now) == {
        ("q", "high"): [0, 0, 1, 0],
        ("r", "low"): [0, 0, 0, 1],
    }
    assert window.counts(600, now)[("q", "high")] == [1, 0, 1, 0]
    window.observe(0.2, "q", "high", t0 + 70)  # 70 s on: the slots older than 60 s are gone
    assert window.counts(3600, t0 + 70) == {("q", "high"): [0, 1, 0, 0], ("r", "low"): [0, 0, 0, 1]}


def test_a_lag_view_gives_the_quantiles_of_all_and_of_each_queue_and_priority() -> None:
    view = lag_view({("a", "high"): [4, 0, 0, 0], ("b", "low"): [0, 0, 4, 0]}, BOUNDS)
    assert (view["count"], view["p50"], view["p99"]) == (8, 0.1, 0.99)  # 0.5 + 0.5 * 3.92 / 4
    assert [(g["queue"], g["priority"], g["count"], g["p50"]) for g in view["by"]] == [
        ("a", "high", 4, 0.05),
        ("b", "low", 4, 0.75),
    ]
    assert lag_view({}, BOUNDS) == {"count": 0, "p50": None, "p99": None, "by": []}


def test_the_metrics_feed_the_histogram_and_the_window_with_the_same_value() -> None:
    metrics = Metrics()
    metrics.observe_lease_lag(0.3, "q", "normal", 500.0)
    metrics.observe_fire_lag(0.02, "q", "normal", 500.0)
    assert metrics.registry.get_sample_value("schedd_lease_lag_seconds_count") == 1
    assert metrics.registry.get_sample_value("schedd_lease_lag_seconds_sum") == 0.3
    assert sum(metrics.lease_window.counts(60, 500.0)[("q", "normal")]) == 1
    assert metrics.registry.get_sample_value("schedd_fire_lag_seconds_count") == 1
    assert sum(metrics.fire_window.counts(60, 500.0)[("q", "normal")]) == 1
