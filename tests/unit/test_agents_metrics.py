"""Prometheus metrics: names and units, bounded labels, no per-stream data, private registries."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.metrics import Metrics


def _samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_event_counters_by_result_and_reason() -> None:
    m = Metrics(process=False)
    m.event_accepted(5)
    m.event_dead_lettered("unknown_key", 2)
    m.event_dead_lettered("malformed")
    m.event_late(3)
    s = _samples(m)
    assert s[("stream_dp_events_total", (("result", "accepted"),))] == 5
    assert s[("stream_dp_events_total", (("result", "dead_lettered"),))] == 3
    assert s[("stream_dp_events_total", (("result", "late"),))] == 3
    assert s[("stream_dp_dead_letters_total", (("reason", "unknown_key"),))] == 2
    assert s[("stream_dp_dead_letters_total", (("reason", "malformed"),))] == 1
    assert s[("stream_dp_dead_letters_total", (("reason", "late"),))] == 3


def test_reason_labels_are_bounded() -> None:
    """Free text (which could carry a stream name or payload) never becomes a label value."""
    m = Metrics(process=False)
    m.event_dead_lettered("unknown key 'eu/fr/paris'")
    m.event_dead_lettered("x" * 100)
    reasons = {dict(lbl).get("reason") for (name, lbl) in _samples(m)
               if name == "stream_dp_dead_letters_total"}
    assert reasons == {"other"}


def test_ticks_latency_reconcile_and_gauges() -> None:
    m = Metrics(process=False)
    m.tick_released(0.3, n_streams=100)
    m.tick_released(2.0, n_streams=100)
    m.checkpoint_written(0.01)
    m.set_consumer_lag(42)
    m.set_ready(True)
    m.set_leader(True)
    m.histogram_published(tick=7, seconds=0.002, iterations=3, residual=1e-12)
    m.release_conflict()
    m.reconcile_skipped(2)
    s = _samples(m)
    assert s[("stream_dp_ticks_released_total", ())] == 2
    assert s[("stream_dp_releases_total", ())] == 200
    assert s[("stream_dp_tick_latency_seconds_count", ())] == 2
    assert s[("stream_dp_tick_latency_seconds_sum", ())] == pytest.approx(2.3)
    assert s[("stream_dp_tick_latency_seconds_bucket", (("le", "0.5"),))] == 1
    assert s[("stream_dp_checkpoint_seconds_count", ())] == 1
    assert s[("stream_dp_consumer_lag_messages", ())] == 42
    assert s[("stream_dp_ready", ())] == 1
    assert s[("stream_dp_reconcile_leader", ())] == 1
    assert s[("stream_dp_reconcile_seconds_count", ())] == 1
    assert s[("stream_dp_histograms_published_total", ())] == 1
    assert s[("stream_dp_reconcile_last_tick", ())] == 7
    assert s[("stream_dp_reconcile_iterations", ())] == 3
    assert s[("stream_dp_release_conflicts_total", ())] == 1
    assert s[("stream_dp_reconcile_skipped_ticks_total", ())] == 2


def test_conventions_base_units_no_stream_labels() -> None:
    m = Metrics(process=True)
    m.event_accepted()
    m.event_dead_lettered("oversize")
    allowed_labels = {"result", "reason", "le"}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        if fam.name.startswith("process_"):
            continue
        assert fam.name.startswith("stream_dp_")
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples)
        for unit in ("_ms", "_milliseconds", "_minutes"):
            assert unit not in fam.name
        for s in fam.samples:
            assert set(s.labels) <= allowed_labels, (s.name, s.labels)


def test_registries_are_independent() -> None:
    a, b = Metrics(process=False), Metrics(process=False)
    a.event_accepted(10)
    assert _samples(b)[("stream_dp_events_total", (("result", "accepted"),))] == 0


def test_negative_counts_rejected_and_state_unchanged() -> None:
    m = Metrics(process=False)
    m.event_accepted(1)
    with pytest.raises(ValueError, match="n must be >= 0"):
        m.event_accepted(-1)
    assert _samples(m)[("stream_dp_events_total", (("result", "accepted"),))] == 1


def test_raw_event_counters_are_off_the_endpoint_unless_asked_for() -> None:
    """The event counters are raw counts: without ``event_counts`` they count privately and
    ``/metrics`` never shows them; the worker's default setting keeps them off."""
    from agents.config import Settings
    from agents.metrics import EVENT_COUNT_METRICS

    hidden = Metrics(process=False, event_counts=False)
    hidden.event_accepted(7)
    hidden.event_dead_lettered("unknown_key", 2)
    hidden.set_consumer_lag(5)
    hidden.stream_clipped(3)  # a raw threshold bit (issue #32)
    hidden.ingest_checkpoint_written(0.01)  # one per commit of arrived records
    text = hidden.exposition().decode()
    for name in EVENT_COUNT_METRICS:
        assert name.removesuffix("_total") not in text, name
    assert "stream_dp_ready" in text
    assert hidden.private_registry.get_sample_value(
        "stream_dp_events_total", {"result": "accepted"}) == 7
    assert hidden.private_registry.get_sample_value("stream_dp_clipped_total") == 3
    shown = Metrics(process=False, event_counts=True)
    shown.event_accepted(7)
    shown.stream_clipped(3)
    shown.ingest_checkpoint_written(0.01)
    text = shown.exposition().decode()
    assert 'stream_dp_events_total{result="accepted"} 7.0' in text
    assert "stream_dp_clipped_total 3.0" in text
    assert "stream_dp_ingest_checkpoint_seconds_count 1.0" in text
    settings = Settings.load(env={"STREAM_DP_ORIGIN": "1"})
    assert settings.metrics_event_counts == 0 and settings.web_host == "127.0.0.1"
