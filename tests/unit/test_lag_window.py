"""The scheduling-lag window kept next to the lag histograms (``schedd.metrics``): quantiles
from bucket counts as Prometheus computes them, slots that age out of the window, the split by
queue and priority (``schedd.api.views.lag_view``), and the recent samples one by one (kept for
their time and up to their count)."""

from __future__ import annotations

import pytest

from schedd.api.operations import BY_ID
from schedd.api.views import lag_view
from schedd.metrics import (
    LAG_SLOT_S,
    SAMPLES_CAP,
    SAMPLES_KEEP_S,
    LagSamples,
    LagWindow,
    Metrics,
    quantile,
)

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
    assert metrics.lease_samples.recent(60, 500.0, 1_000_000) == [(999_700, 0.3, "q", "normal")]
    assert metrics.fire_samples.recent(60, 500.0, 1_000_000) == [(999_980, 0.02, "q", "normal")]


def test_a_sample_is_due_its_lag_before_it_was_observed_on_the_readers_wall_clock() -> None:
    samples = LagSamples()
    samples.observe(1.5, "q", "high", 100.0)  # observed at mono 100: due 1.5 s before
    samples.observe(0.0, "r", "low", 130.25)
    # read at mono 160, wall 1_000_000 ms: observed 60 s and 29.75 s ago
    assert samples.recent(900, 160.0, 1_000_000) == [
        (1_000_000 - 61_500, 1.5, "q", "high"),
        (1_000_000 - 29_750, 0.0, "r", "low"),
    ]
    assert samples.recent(45, 160.0, 1_000_000) == [(970_250, 0.0, "r", "low")]


def test_a_sample_given_its_due_time_keeps_it() -> None:
    samples = LagSamples()
    samples.observe(0.0, "q", "high", 100.0, due_ms=999_000)  # fired ahead of its due time
    samples.observe(2.0, "q", "high", 101.0, due_ms=990_000)
    assert samples.recent(900, 160.0, 1_000_000) == [
        (999_000, 0.0, "q", "high"),
        (990_000, 2.0, "q", "high"),
    ]


def test_the_samples_keep_only_their_window() -> None:
    samples = LagSamples(keep_s=60)
    for second in range(0, 100, 10):  # one at 0, 10, ..., 90
        samples.observe(0.1, "q", "normal", 1000.0 + second)
    # the newest at 1090: those older than 60 s (1000 to 1020) are gone
    assert len(samples) == 7
    # and a read later on leaves out what aged since, however long the window asked
    assert len(samples.recent(3600, 1150.0, 0)) == 1
    assert samples.recent(3600, 1200.0, 0) == []


def test_the_samples_keep_only_the_newest_up_to_their_cap() -> None:
    samples = LagSamples(keep_s=SAMPLES_KEEP_S, cap=5)
    for i in range(8):
        samples.observe(i / 100, "q", "normal", 10.0 + i / 1000)
    assert len(samples) == 5
    assert [lag for _, lag, _, _ in samples.recent(60, 11.0, 0)] == [0.03, 0.04, 0.05, 0.06, 0.07]


def test_the_metrics_keep_the_documented_samples() -> None:
    metrics = Metrics()
    for ring in (metrics.fire_samples, metrics.lease_samples):
        assert ring.keep_s == SAMPLES_KEEP_S == 15 * 60
        for i in range(SAMPLES_CAP + 10):
            ring.observe(0.01, "q", "normal", 5.0 + i / 1e6)
        assert len(ring) == SAMPLES_CAP
    [samples] = [q for q in BY_ID["scheduling_lag"].query if q.name == "samples"]
    assert f"the last {SAMPLES_KEEP_S / 60:.0f} minutes" in samples.description
    assert f"the newest {SAMPLES_CAP}" in samples.description
