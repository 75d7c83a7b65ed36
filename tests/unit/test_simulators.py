"""Simulators: deterministic, sized as documented, consistent with their domain files."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import numpy as np
import pytest

from agents.cli import build_parser
from agents.config.settings import Settings
from simulators.base import DEFAULT_START, TimeAxis
from simulators.census import ATTRIBUTES, CensusHouseholds
from simulators.cli import build_simulator
from simulators.logfile import Event, LogFormatError, format_event, read_log, write_log
from simulators.restaurant import CONSTRAINTS, PACKAGES, RestaurantSales
from simulators.web_traffic import PROFILES, WebTraffic
from stream_dp.domain import Domain


def _sim(argv: list[str]):  # type: ignore[no-untyped-def]
    args = build_parser("simulate").parse_args(["simulate", *argv])
    return build_simulator(args)


def test_package_matrix_spans_nonnegative_solutions_of_paper_000_constraints() -> None:
    assert (CONSTRAINTS @ PACKAGES == 0).all()
    assert (PACKAGES >= 0).all()
    # brute force: every non-negative integer solution of B v = 0 with at most 8 units per item
    # is a sum of packages (breadth-first over sums of package columns inside the box)
    box = 9
    sols = {v for v in itertools.product(range(box), repeat=5) if not (CONSTRAINTS @ v).any()}
    reachable = {(0, 0, 0, 0, 0)}
    frontier = list(reachable)
    while frontier:
        nxt = []
        for v in frontier:
            for col in PACKAGES.T:
                w = tuple(int(a + b) for a, b in zip(v, col, strict=True))
                if max(w) < box and w not in reachable:
                    reachable.add(w)
                    nxt.append(w)
        frontier = nxt
    assert len(sols) > 50
    assert sols == reachable


def test_restaurant_counts_satisfy_package_constraints_every_tick() -> None:
    sim = RestaurantSales(TimeAxis(60, 86_400), seed=3)
    counts = np.array(list(sim.tick_counts()))
    assert counts.shape == (60, 5) and counts.sum() > 1000
    assert not (counts @ CONSTRAINTS.T).any()


def test_events_match_tick_counts_and_stay_inside_their_tick() -> None:
    axis = TimeAxis(30, 60.0)
    sim = WebTraffic(axis, seed=9, rate=20)
    counts = np.array(list(sim.tick_counts()))
    seen = np.zeros_like(counts)
    last = -1.0
    for ev in sim.events():
        t = int((ev.ts - axis.start) // axis.tick_seconds)
        assert 0 <= t < 30 and ev.ts >= last and ev.value == 1.0
        last = ev.ts
        seen[t, sim.keys.index(ev.key)] += 1
    assert (seen == counts).all()


@pytest.mark.parametrize(
    "argv",
    [
        ["restaurant", "--ticks", "20"],
        ["census", "--ticks", "10", "--attributes", "4"],
        ["nettrace", "--ticks", "50"],
    ],
)
def test_same_seed_same_bytes_other_seed_other_bytes(argv: list[str]) -> None:
    def text(seed: str) -> str:
        out = io.StringIO()
        write_log(_sim([*argv, "--seed", seed]).events(), out, "csv")
        return out.getvalue()

    assert text("1") == text("1")
    assert text("1") != text("2")


def test_profiles_have_the_documented_sizes() -> None:
    assert PROFILES["searchlogs"].ticks == 32_768
    assert PROFILES["nettrace"].ticks == 65_536
    wc = _sim(["worldcup98"])
    assert wc.axis.ticks == 2_088
    total = sum(int(c.sum()) for c in wc.tick_counts())
    assert total == 7_518_579  # exact, by construction (multinomial)


def test_web_traffic_is_bursty() -> None:
    sim = WebTraffic(TimeAxis(4096, 60.0), seed=0, rate=8)
    per_tick = np.array([c.sum() for c in sim.tick_counts()], dtype=float)
    # a Poisson stream at this rate has variance ≈ mean; bursts and the diurnal cycle add a lot
    assert per_tick.var() > 3 * per_tick.mean()
    assert per_tick.max() > 4 * np.median(per_tick)


@pytest.mark.parametrize(
    "argv",
    [
        ["restaurant", "--ticks", "5"],
        ["census", "--ticks", "5", "--attributes", "3"],
        ["census", "--ticks", "5", "--attributes", str(len(ATTRIBUTES))],
        ["searchlogs", "--ticks", "5"],
    ],
)
def test_domain_file_declares_every_key_and_settings_file_loads(
    argv: list[str], tmp_path: Path
) -> None:
    sim = _sim(argv)
    (tmp_path / "domain.toml").write_text(sim.domain().to_toml(), encoding="utf-8")
    domain = Domain.from_file(tmp_path / "domain.toml")
    for key in sim.keys:
        assert len(domain.nodes_for_event(key)) >= 1  # KeyError if undeclared
    (tmp_path / "s.toml").write_text(sim.domain().settings_toml(sim.axis.start, "domain.toml"))
    s = Settings.load(tmp_path / "s.toml", env={})
    assert s.origin == DEFAULT_START and s.tick_seconds == sim.axis.tick_seconds
    assert Path(s.domain_file) == tmp_path / "domain.toml"


def test_restaurant_domain_declares_the_package_constraints(tmp_path: Path) -> None:
    sim = RestaurantSales(TimeAxis(3, 86_400), seed=0)
    (tmp_path / "d.toml").write_text(sim.domain().to_toml())
    domain = Domain.from_file(tmp_path / "d.toml")
    assert [g.name for g in domain.groups] == ["packages"]
    assert np.array_equal(domain.groups[0].matrix, CONSTRAINTS)


def test_census_cells_follow_grid_naming_and_probabilities_sum_to_one() -> None:
    sim = CensusHouseholds(TimeAxis(2, 1.0), seed=1, k=2)
    assert sim.keys[0] == "age=0-17|tenure=own" and len(sim.keys) == 8
    assert sim.cell_probabilities().sum() == pytest.approx(1.0)


def test_bad_parameters_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="ticks"):
        TimeAxis(0)
    with pytest.raises(ValueError, match="tick_seconds"):
        TimeAxis(3, 0.0001)
    with pytest.raises(ValueError, match="k"):
        CensusHouseholds(TimeAxis(3), seed=0, k=7)
    with pytest.raises(ValueError, match="seed"):
        RestaurantSales(TimeAxis(3), seed=-1)


def test_log_round_trip_csv_and_jsonl(tmp_path: Path) -> None:
    events = [Event("a,b", 1704067200.125, 1.0), Event('q"x', 1704067201.0, 2.5), Event("c", 3.0)]
    for fmt in ("csv", "jsonl"):
        path = tmp_path / f"log.{fmt}"
        with open(path, "w", encoding="utf-8", newline="") as fh:
            assert write_log(events, fh, fmt) == 3
        back = list(read_log(path))
        assert [r.event for r in back] == events
        assert [r.number for r in back] == [1, 2, 3]
        # resuming after record 1 yields records 2 and 3 only
        resumed = list(read_log(path, start_offset=back[0].end_offset, start_number=1))
        assert [r.event for r in resumed] == events[1:]
    assert format_event(Event("k", 1.5), "csv") == "1.500,k,1\n"


def test_log_reader_errors_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "a", "ts": 1}\n{"key": "", "ts": 2}\n')
    with pytest.raises(LogFormatError, match=r"bad.jsonl:2: key must be"):
        list(read_log(bad))
    nohdr = tmp_path / "nohdr.csv"
    nohdr.write_text("1,a,1\n")
    with pytest.raises(LogFormatError, match="header"):
        list(read_log(nohdr))
    nan = tmp_path / "nan.csv"
    nan.write_text("ts,key,value\n1,a,nan\n")
    with pytest.raises(LogFormatError, match="value must be finite"):
        list(read_log(nan))
