"""config/alerts.yml stays in step with the metrics and the docs: every metric an alert reads is
one schedd exports and documents, every alert is explained in operations.md, and a quantile
alert's threshold is a bound of its histogram's buckets (so the comparison is exact, not an
interpolation inside a bucket)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from schedd.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "config" / "alerts.yml"

_RULE = re.compile(r"^\s*- alert: (\w+)\n(?:(?!\s*- alert:).*\n)*?\s*expr: (.+)$", re.MULTILINE)
_METRIC = re.compile(r"\bschedd_\w+")
_QUANTILE = re.compile(r"histogram_quantile\(.*\b(schedd_\w+)_bucket\b.*\)\s*>\s*([0-9.]+)\s*$")


def rules() -> dict[str, str]:
    """Alert name -> its expression."""
    found = dict(_RULE.findall(ALERTS.read_text()))
    assert len(found) == ALERTS.read_text().count("- alert:")
    return found


def documented_metrics() -> set[str]:
    table = (ROOT / "docs" / "metrics.md").read_text()
    return set(re.findall(r"`(schedd_\w+)`", table))


def histogram_bounds() -> dict[str, list[float]]:
    """The bucket bounds of each unlabelled histogram a node's Metrics registers."""
    bounds: dict[str, list[float]] = {}
    for family in Metrics().registry.collect():
        if family.type == "histogram":
            for sample in family.samples:
                if sample.name.endswith("_bucket") and sample.labels["le"] != "+Inf":
                    bounds.setdefault(family.name, []).append(float(sample.labels["le"]))
    return bounds


def test_the_rules_are_read() -> None:
    assert {"ScheddNoLeader", "ScheddJournalSyncSlow"} <= set(rules())


@pytest.mark.parametrize(("alert", "expr"), list(rules().items()))
def test_an_alert_reads_documented_metrics(alert: str, expr: str) -> None:
    names = {re.sub(r"_(bucket|count|sum)$", "", m) for m in _METRIC.findall(expr)}
    assert names, f"{alert} reads no schedd metric"
    assert names <= documented_metrics(), f"{alert}: not in docs/metrics.md"


@pytest.mark.parametrize("alert", list(rules()))
def test_an_alert_is_explained_in_operations(alert: str) -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert re.search(rf"^\| `{alert}` \(\w+\) \|", operations, re.MULTILINE), alert


def test_a_quantile_threshold_is_a_bucket_bound() -> None:
    bounds = histogram_bounds()
    checked = []
    for alert, expr in rules().items():
        m = _QUANTILE.search(expr)
        if m:
            metric, threshold = m.group(1), float(m.group(2))
            assert threshold in bounds[metric], f"{alert}: {threshold} not a bound of {metric}"
            checked.append(alert)
    assert {"ScheddSchedulingLagHigh", "ScheddJournalSyncSlow"} <= set(checked)
