"""``simulators/attributes.py`` and ``stream-dp simulate attributes``: deterministic, valid input
for ``stream-dp marginals``, with the dependence the benchmark relies on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulators.attributes import AttributeEvents
from stream_dp.cli import main


def test_deterministic_sorted_and_in_range() -> None:
    a = AttributeEvents(m=20, ticks=30, rate=40, seed=3)
    b = AttributeEvents(m=20, ticks=30, rate=40, seed=3)
    assert list(a.lines()) == list(b.lines())
    bits, ticks, ts = a.generate()
    assert bits.shape[1] == 20 and set(np.unique(bits)) <= {0, 1}
    assert np.all(np.diff(ts) >= 0)
    assert np.all((ts - a.start) // a.tick_seconds == ticks)
    assert sorted(x for c in a.clusters for x in c) == list(range(20))
    assert list(AttributeEvents(m=20, ticks=30, rate=40, seed=4).lines()) != list(a.lines())


def test_sparse_and_dependent_within_clusters() -> None:
    g = AttributeEvents(m=24, ticks=100, rate=200, seed=0)
    bits, _, _ = g.generate()
    rates = bits.mean(axis=0)
    assert 0.03 < rates.mean() < 0.3
    big = next(c for c in g.clusters if len(c) >= 3)
    i, j = big[0], big[1]
    both = float((bits[:, i] & bits[:, j]).mean())
    assert both > 2 * rates[i] * rates[j]  # strongly dependent inside a cluster


def test_simulate_command_writes_marginals_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ev.jsonl"
    assert (
        main(
            [
                "simulate",
                "attributes",
                "--attributes",
                "10",
                "--ticks",
                "5",
                "--rate",
                "20",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    lines = out.read_text().splitlines()
    assert lines
    for line in lines:
        ev = json.loads(line)
        assert set(ev) == {"ts", "attrs"} and len(ev["attrs"]) == 10
    assert main(["simulate", "attributes", "--ticks", "5"]) == 2  # --out is required
    (tmp_path / "q.json").write_text("[[0, 1, 2]]")
    args = [
        "marginals",
        "--events",
        str(out),
        "--attributes",
        "10",
        "--epsilon",
        "1",
        "--decay",
        "0.9",
        "--tick-seconds",
        "60",
        "--origin",
        "1704067200",
        "--last-tick",
        "5",
        "--queries",
        str(tmp_path / "q.json"),
        "--out",
        str(tmp_path / "a.json"),
    ]
    assert main(args) == 0
    assert len(json.loads((tmp_path / "a.json").read_text())["answers"][0]) == 8


def test_tree_attributes_are_dense_and_deterministic() -> None:
    from simulators.attributes import TreeAttributes

    g = TreeAttributes(m=12, ticks=20, rate=50, seed=2)
    assert list(g.lines()) == list(TreeAttributes(m=12, ticks=20, rate=50, seed=2).lines())
    bits, _, _ = g.generate()
    assert 0.3 < bits.mean() < 0.7
    p, c = g.clusters[0]
    assert (bits[:, p] == bits[:, c]).mean() > 0.75  # a child copies its parent 85 % of the time
