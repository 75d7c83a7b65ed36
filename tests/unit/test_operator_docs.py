"""The operator-facing documents say what the issue asked for: metrics are operator data, the
dead-letter record and its accounting, the JSON key's precedence, the parameter ranges."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _text(name: str) -> str:
    return " ".join((DOCS / name).read_text(encoding="utf-8").split())


def test_privacy_says_metrics_are_operator_data() -> None:
    text = _text("privacy.md")
    assert "## Operator data" in (DOCS / "privacy.md").read_text(encoding="utf-8")
    assert "operator data, never for publication" in text
    assert "metrics_event_counts = 1" in text and "127.0.0.1" in text


def test_dead_letter_record_is_documented() -> None:
    for name in ("guide.md", "CONTRACTS.md"):
        text = _text(name)
        assert '"schema": "dp.events.dlq"' in text, name
        assert re.search(r"JSON.{0,60}wins over the Kafka record key", text), name
        assert re.search(r"dead_lettered.{0,60}excludes late", text), name


def test_ranges_and_maximum_epsilon_are_documented() -> None:
    from stream_dp.limits import CAP_RANGE, EPSILON_RANGE, HORIZON_MAX, RHO_RANGE

    text = _text("accuracy.md")
    assert "The maximum ε is **1e6**" in text and EPSILON_RANGE == (1e-6, 1e6)
    assert f"{HORIZON_MAX:,}".replace(",", " ") in text
    assert RHO_RANGE == (1e-12, 1e12) and CAP_RANGE == (1e-6, 1e9)
    assert "max_memory_mb" in text
