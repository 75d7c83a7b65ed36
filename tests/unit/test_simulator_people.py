"""People in the simulators (issue 34): ``stream-dp simulate --people`` and the demo's traffic.

Without ``--people`` every byte is what it was before people existed (pinned digests); with it,
the events are the same ones plus a person each, drawn from the documented Zipf law
(checked against scipy's ``zipfian`` distribution, an independent oracle, at a fixed seed with
a loose p-value bound), and each record is keyed by the person's UTF-8 bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from simulators import cli as sim_cli
from simulators.logfile import Event, read_log
from simulators.people import People

ROOT = Path(__file__).resolve().parents[2]

#: (argv, log formats) of every scenario, small
SCENARIOS: list[tuple[list[str], tuple[str, ...]]] = [
    (["restaurant", "--ticks", "20"], ("csv", "jsonl")),
    (["census", "--ticks", "10", "--attributes", "4"], ("csv", "jsonl")),
    (["attributes", "--ticks", "5", "--attributes", "8", "--rate", "50"], ("jsonl",)),
    (["searchlogs", "--ticks", "30"], ("csv", "jsonl")),
    (["nettrace", "--ticks", "50"], ("csv", "jsonl")),
    (["worldcup98", "--ticks", "3"], ("csv", "jsonl")),
]

#: SHA-256 of the logs and of the (key, value) records of each scenario at seed 3, computed with
#: the simulators as they were before people were added (commit 4e3f55c): without --people the
#: produced bytes must stay exactly these (numpy 2.4 and 2.5 give the same)
PINNED = {
    "restaurant csv": "8c4daa8e88cb08d24a486c383184f5d0cd73d183402426b75f9745ad068b6ef9",
    "restaurant jsonl": "55a4b0c62252dc6199936724d7f59f885afe236423e1ca5618030396c9773370",
    "restaurant records": "bfe3bdba37718cd7f9cab13b735233d4f45959720c697b6b655200b72f70d7e5",
    "census csv": "948e9668e047a16cc083ca465f5ef0fa655453a276158cdf981177746ba18535",
    "census jsonl": "db3b276e82986b518ad816854896bd708bd3f91c19bb5d06c61961b7471635c2",
    "census records": "dcaa4b9ac414265c511900a5862af1c8b9a138bf2a7d98badc3c98ff98524c7e",
    "attributes jsonl": "67036a4e733943a31a6a9d6c0a49533d07e842ff311083766445950d998661ff",
    "attributes records": "732553b3dbf9761e270dfbcb308e38c4efcfa70b190dfd959fd6a6438dfd48ce",
    "searchlogs csv": "6ae768f54ad9e2b46715311c58746be16d9caec6a1e1fa8fb0062377cd3e8060",
    "searchlogs jsonl": "7d675ace5f48777f83a607532035da5f2c637419b41baff7267a3854d0234e3e",
    "searchlogs records": "02af3ecd46c4b5f1a6a65f0d0e4a94557b1af5ad2e74f219d4743d2ef6ea1a2d",
    "nettrace csv": "0c046ca2c84a426db028f195a80393e11bba0c42dfb9046689d3040ad61ccea0",
    "nettrace jsonl": "a1a7a55c22e560d3e631afd9dc35cfaa493f3a4777c79b12be74ba007edeb2e8",
    "nettrace records": "2939e20c0739fde7c36394e294bbf919b3c344090b5c1ec8c3b2cea989d9387f",
    "worldcup98 csv": "a7c3e119f9ae6077c5c88054071be5fb75059567701f815d843619897410515c",
    "worldcup98 jsonl": "8d09f378c159db3ddbd473836c3fc1b7e0ed999ea993a0448fe87bfd4dec5614",
    "worldcup98 records": "008d02c21ae040f1973685d089c99e1da4f362ecb6dcf9a0a2e419de8e696d7a",
    "demo web": "baa973fcffa2f5e7c3b2dc59bb6d4dc9a5fde8ef20b4638c6200bc3d47adac04",
}


def _args(argv: list[str], *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    return parser.parse_args([*argv, "--seed", "3", *extra])


def _log(tmp: Path, argv: list[str], fmt: str, *extra: str) -> bytes:
    out = tmp / f"log-{len(list(tmp.iterdir()))}.{fmt}"
    assert sim_cli.run(_args(argv, "--out", str(out), *extra)) == 0
    return out.read_bytes()


def _events(argv: list[str], *extra: str) -> Iterator[Event]:
    """The events ``--to-topic`` would send (what run() hands the producer)."""
    sent: list[Event] = []

    async def produce(records, args, stop):  # type: ignore[no-untyped-def]
        sent.extend(r.event for r in records)
        return sim_cli.Produced(len(sent), False, 0.0, "t")

    assert sim_cli.run(_args(argv, "--to-topic", *extra), produce=produce) == 0
    return iter(sent)


def _record_bytes(event: Event) -> bytes:
    """What the service's producer sends: the key, and the value as ``encode_event`` has it."""
    value = json.dumps(event.to_message(), separators=(",", ":")).encode()
    return event.partition_key.encode() + b"\0" + value + b"\n"


def _digests(tmp: Path) -> dict[str, str]:
    got = {}
    for argv, formats in SCENARIOS:
        for fmt in formats:
            got[f"{argv[0]} {fmt}"] = hashlib.sha256(_log(tmp, argv, fmt)).hexdigest()
        h = hashlib.sha256()
        for ev in _events(argv):
            h.update(_record_bytes(ev))
        got[f"{argv[0]} records"] = h.hexdigest()
    return got


def test_without_people_every_byte_is_as_before(tmp_path: Path) -> None:
    got = _digests(tmp_path)
    from agents.commands._demo_traffic import Traffic

    h = hashlib.sha256()
    for ev in Traffic(1_704_067_200.0, 1.0, 60.0, 5, 30).events():
        h.update(ev.record_key + b"\0" + json.dumps(ev.message()).encode() + b"\n")
    got["demo web"] = h.hexdigest()
    assert got == PINNED


def _strip_person(data: bytes, fmt: str, field: str) -> bytes:
    """The log without its person column (CSV) or field (JSON lines), checked to be there."""
    text = data.decode()
    if fmt == "csv":
        lines = text.splitlines(keepends=True)
        assert lines[0] == f"ts,key,value,{field}\n"
        assert all(re.search(r",u[0-9]+$", line) for line in lines[1:])
        return "".join(line.rsplit(",", 1)[0] + "\n" for line in lines).encode()
    stripped, n = re.subn(rf',\s?"{field}":\s?"u[0-9]+"(?=}}\n)', "", text)
    assert n == text.count("\n") > 0
    return stripped.encode()


@pytest.mark.parametrize(("argv", "formats"), SCENARIOS, ids=[a[0] for a, _ in SCENARIOS])
def test_people_only_add_a_field_and_key_the_record_by_it(
    argv: list[str], formats: tuple[str, ...], tmp_path: Path
) -> None:
    people = ("--people", "50", "--user-field", "visitor")
    for fmt in formats:
        plain = _log(tmp_path, argv, fmt)
        with_people = _log(tmp_path, argv, fmt, *people)
        assert with_people != plain
        assert _strip_person(with_people, fmt, "visitor") == plain
    before = list(_events(argv))
    after = list(_events(argv, *people))
    assert [Event(e.key, e.ts, e.value, e.attrs) for e in after] == before
    expected = People(50, seed=3, user_field="visitor")
    for ev, rank in zip(after, expected.ranks(), strict=False):
        assert ev.user == f"u{rank}" and 1 <= rank <= 50
        assert ev.partition_key.encode() == ev.user.encode()
        assert ev.to_message()["visitor"] == ev.user
    # the log and the records name the same person for every event
    log = tmp_path / f"again.{formats[-1]}"
    log.write_bytes(_log(tmp_path, argv, formats[-1], *people))
    if formats[-1] == "jsonl":
        users = [json.loads(line)["visitor"] for line in log.read_text().splitlines()]
        assert users == [e.user for e in after]


def test_same_seed_same_people_other_seed_other_people() -> None:
    def ranks(seed: int, n: int = 10_000) -> list[int]:
        it = People(1000, seed=seed).ranks()
        return [next(it) for _ in range(n)]

    assert ranks(1) == ranks(1)
    assert ranks(1) != ranks(2)


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of observed rank counts against rank probabilities, ranks pooled into bins of
    at least 20 expected events (log-spaced: the head rank by rank, the tail in blocks)."""
    total = counts.sum()
    edges = [0]
    acc = 0.0
    for r, p in enumerate(probs, start=1):
        acc += p * total
        if acc >= 20:
            edges.append(r)
            acc = 0.0
    edges[-1] = len(probs)
    obs = np.add.reduceat(counts, edges[:-1])
    exp = np.add.reduceat(probs, edges[:-1]) * total
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("exponent", [0.0, 0.8, 1.0, 1.5])
def test_people_follow_the_documented_zipf_law(exponent: float) -> None:
    """The rank of each event's person against scipy's Zipfian pmf (independent oracle) on
    200 000 events, by a χ² test at a fixed seed with a loose bound p > 1e-6."""
    n, events = 5000, 200_000
    it = People(n, exponent, seed=34).ranks()
    ranks = np.fromiter((next(it) for _ in range(events)), dtype=np.int64, count=events)
    counts = np.bincount(ranks, minlength=n + 1)[1:]
    oracle = stats.zipfian(exponent, n).pmf(np.arange(1, n + 1)) if exponent > 0 else (
        np.full(n, 1.0 / n))
    assert _chi_square_p(counts, oracle) > 1e-6


def test_the_heavy_tail_is_as_documented() -> None:
    """The module docstring's example: 100 000 events over 10 000 people at s = 1: person u1
    about 10 200 events, u100 about 100, the upper half of the ranks about 1.4 each; most
    people a few events, a few people thousands."""
    n, events = 10_000, 100_000
    it = People(n, 1.0, seed=7).ranks()
    counts = np.bincount([next(it) for _ in range(events)], minlength=n + 1)[1:]
    h = float(np.sum(1.0 / np.arange(1, n + 1)))
    # Poisson-like counts: 6 standard deviations either side of the documented means
    assert abs(counts[0] - events / h) < 6 * np.sqrt(events / h)
    assert abs(counts[99] - events / (100 * h)) < 6 * np.sqrt(events / (100 * h))
    assert 1.2 <= counts[5000:].mean() <= 1.6  # expected 1.42
    active = counts[counts > 0]
    assert np.median(active) <= 3 and active.max() >= 5000
    assert np.sum(counts >= 1000) <= 10  # a few people with thousands


def test_demo_traffic_draws_the_same_people_and_keys_by_them() -> None:
    from agents.commands._demo_traffic import AttributeTraffic, Traffic

    plain = list(Traffic(1_704_067_200.0, 1.0, 60.0, 5, 30).events())
    people = list(Traffic(1_704_067_200.0, 1.0, 60.0, 5, 30, people=40,
                          user_field="visitor").events())
    ranks = People(40, seed=5).ranks()
    assert len(people) == len(plain) > 500
    for a, b in zip(plain, people, strict=True):
        rank = next(ranks)
        assert (b.key, b.ts, b.value, b.user) == (a.key, a.ts, a.value, f"u{rank}")
        assert b.record_key == b.user.encode() and b.message()["visitor"] == b.user
        assert "visitor" not in a.message() and "user" not in a.message()
    attrs = list(AttributeTraffic(1_704_067_200.0, 1.0, 30.0, 5, 5, 8, people=3).events())
    assert {e.message()["user"] for e in attrs} <= {"u1", "u2", "u3"}
    assert all(e.record_key == e.user.encode() for e in attrs if e.user)


def test_a_log_with_people_reads_back_for_replay(tmp_path: Path) -> None:
    """``stream-dp replay`` reads a log with people (the extra field or column is ignored)."""
    for fmt in ("csv", "jsonl"):
        path = tmp_path / f"p.{fmt}"
        path.write_bytes(_log(tmp_path, ["nettrace", "--ticks", "20"], fmt, "--people", "9"))
        plain = tmp_path / f"q.{fmt}"
        plain.write_bytes(_log(tmp_path, ["nettrace", "--ticks", "20"], fmt))
        assert [r.event for r in read_log(path)] == [r.event for r in read_log(plain)]


def _stream_dp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli", "simulate", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize(("args", "message"), [
    (["--people", "0"], "--people must be an integer in [1, 10000000], got 0"),
    (["--people", "5", "--people-exponent", "-1"],
     "--people-exponent must be a number in [0, 4], got -1.0"),
    (["--people", "5", "--people-exponent", "nan"],
     "--people-exponent must be a number in [0, 4], got nan"),
    (["--people", "5", "--user-field", "ts"], "--user-field cannot be 'ts'"),
    (["--people", "5", "--user-field", "a b"], "--user-field must be 1-64 characters"),
    (["--user-field", "visitor"], "--user-field needs --people N"),
    (["--people-exponent", "2"], "--people-exponent needs --people N"),
])
def test_bad_people_options_are_one_line_errors(args: list[str], message: str) -> None:
    proc = _stream_dp("nettrace", "--ticks", "2", "--out", "-", *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert proc.stderr.startswith("stream-dp simulate: ")


def test_people_on_stdout_from_the_command() -> None:
    proc = _stream_dp("nettrace", "--ticks", "30", "--people", "7", "--format", "csv",
                      "--out", "-")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "ts,key,value,user"
    users = Counter(line.rsplit(",", 1)[1] for line in lines[1:])
    assert set(users) <= {f"u{r}" for r in range(1, 8)} and users["u1"] == max(users.values())
    assert "7 people (Zipf exponent 1, field 'user')" in proc.stderr


# ------------------------------------------------------------- what a bound K would drop
def test_bound_drops_agrees_with_the_librarys_bounder() -> None:
    """:func:`bound_drops` (plain Python, for the demo) against ``stream_dp.user_level.Bounder``
    (the authoritative rule) on random logs: per person, the same events kept and dropped."""
    import random

    from simulators.person_bound import bound_drops
    from stream_dp.user_level import Bounder, UserBounds

    rng = random.Random(34)
    origin, tick_s = 1_704_067_200.0, 0.5
    for _ in range(200):
        k, period = rng.randrange(1, 6), rng.choice([0, 1, 3, 7])
        n = rng.randrange(0, 300)
        ms = sorted(rng.randrange(0, 40_000) for _ in range(n))  # 80 ticks of 0.5 s
        events = [Event("k", (round(origin * 1000) + m) / 1000, user=f"u{rng.randrange(1, 9)}")
                  for m in ms]
        got = bound_drops(events, max_events=k, period_ticks=period, origin=origin,
                          tick_seconds=tick_s)
        oracle = Bounder(UserBounds(max_events=k, period_ticks=period))
        kept: Counter[str] = Counter()
        dropped: Counter[str] = Counter()
        for m, e in zip(ms, events, strict=True):
            assert e.user is not None
            (kept if oracle.admit(e.user, m // 500 + 1, leaf=0) else dropped)[e.user] += 1
        assert (got.kept, got.dropped) == (kept, dropped)
        assert got.events == n and got.total_dropped == sum(dropped.values())


def test_bound_drops_on_simulated_people_hits_the_heavy_ones() -> None:
    from simulators.person_bound import bound_drops

    events = list(_events(["searchlogs", "--ticks", "120", "--rate", "100"], "--people", "500"))
    got = bound_drops(events, max_events=5, period_ticks=60, origin=1_704_067_200.0,
                      tick_seconds=60.0)
    per_person = Counter(e.user for e in events)
    assert got.events == len(events) and got.people == len(per_person)
    # two periods: nobody keeps more than 2·K, and a person with at most K events keeps all
    assert all(got.kept[p] <= 10 and got.kept[p] + got.dropped[p] == n
               for p, n in per_person.items())
    assert all(got.dropped[p] == 0 for p, n in per_person.items() if n <= 5)
    assert got.dropped.most_common(1)[0][0] == "u1"
    line = got.summary()
    assert line.startswith(f"K = 5 per 60 ticks drops {got.total_dropped:,} of {len(events):,}")
    assert "; most: u1 " in line


def test_bound_drops_refuses_events_without_a_person_and_bad_bounds() -> None:
    from simulators.person_bound import bound_drops

    with pytest.raises(ValueError, match="event 1 has no person"):
        bound_drops([Event("k", 1.0)], max_events=1, period_ticks=0, origin=0.0,
                    tick_seconds=1.0)
    with pytest.raises(ValueError, match="max_events must be"):
        bound_drops([], max_events=0, period_ticks=0, origin=0.0, tick_seconds=1.0)
    with pytest.raises(ValueError, match="period_ticks must be"):
        bound_drops([], max_events=1, period_ticks=-1, origin=0.0, tick_seconds=1.0)
