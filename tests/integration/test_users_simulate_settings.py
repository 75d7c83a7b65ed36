"""`stream-dp simulate --people N --settings-out FILE` (issue #34), from the outside: the file
is user-level as written (privacy_unit, user_field, a period, a K that is the stated high
quantile of the simulated people's events per period), and `stream-dp worker` with it runs the
simulated log at user level: `stream-dp replay --config FILE` keys every record by its person,
no record lands on a wrong partition, and the releases are the exact counts of the log under
that bound."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from agents.config.settings import Settings
from agents.ingest.users import user_bounds
from stream_dp.domain import Domain
from stream_dp.user_level import keep_mask
from tests.integration._users import stream_dp
from tests.integration.pipeline_support import (
    exact_decayed,
    read_topic,
    released,
    wait_for_ticks,
)
from tests.integration.test_pipeline_crashes import bound_of
from tests.integration.test_users_e2e import KEY_1, TICKS, UNTIL, _settings, _worker

pytestmark = pytest.mark.integration

SIM = ("simulate", "searchlogs", "--seed", "34", "--ticks", str(TICKS), "--tick-seconds", "2",
       "--rate", "200", "--people", "400")


def _oracle_k(log: list[dict[str, object]], origin: float, tick_s: float, period: int
              ) -> tuple[int, int]:
    """K = the 99th percentile (inverted CDF, numpy's) of events per (person, period) with at
    least one, and the events a bound K drops."""
    slots = Counter((e["user"], math.floor((float(e["ts"]) - origin) / tick_s) // period)  # type: ignore[arg-type]
                    for e in log)
    counts = np.array(sorted(slots.values()))
    k = int(np.percentile(counts, 99, method="inverted_cdf"))
    return k, int(np.maximum(counts - k, 0).sum())


def test_settings_out_with_people_is_user_level_with_the_stated_k(tmp_path: Path) -> None:
    proc = stream_dp(*SIM, "--user-period-ticks", "4", "--out", str(tmp_path / "log.jsonl"),
                     "--domain-out", str(tmp_path / "domain.toml"),
                     "--settings-out", str(tmp_path / "stream-dp.toml"), check=True)
    s = Settings.load(tmp_path / "stream-dp.toml", env={})
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    k, dropped = _oracle_k(log, s.origin, s.tick_seconds, 4)
    assert (s.privacy_unit, s.user_field, s.user_period_ticks, s.user_max_events) == (
        "user", "user", 4, k)
    assert 1 < k < max(Counter(e["user"] for e in log).values())  # the heavy ones are bounded
    line = re.search(r"worker settings written to .*", proc.stderr)
    assert line is not None
    assert (f"user level, field 'user', K = {k} events per person per 4 ticks, the 99th "
            f"percentile of events per person and period in this simulation: the bound drops "
            f"{dropped:,} of {len(log):,} events") in line.group(0)
    # the default period is a day of ticks; another field name is carried along
    stream_dp(*SIM, "--user-field", "visitor", "--settings-out", str(tmp_path / "day.toml"),
              "--domain-out", str(tmp_path / "domain.toml"), check=True)
    day = Settings.load(tmp_path / "day.toml", env={})
    assert (day.user_period_ticks, day.user_field) == (43_200, "visitor")
    # without --people: the event-level file, as before
    plain = [a for a in SIM if a not in ("--people", "400")]
    stream_dp(*plain, "--settings-out", str(tmp_path / "plain.toml"), check=True)
    assert "privacy_unit" not in (tmp_path / "plain.toml").read_text()
    bad = stream_dp(*plain, "--user-period-ticks", "4", "--settings-out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "--user-period-ticks needs --people N" in bad.stderr


def test_worker_runs_the_simulated_people_at_user_level(
        kafka_broker: str, unique_name: str, tmp_path: Path) -> None:
    log = tmp_path / "visits.jsonl"
    config = tmp_path / "stream-dp.toml"
    stream_dp(*SIM, "--user-period-ticks", "4", "--out", str(log), "--domain-out",
              str(tmp_path / "domain.toml"), "--settings-out", str(config), check=True)
    domain = Domain.from_file(tmp_path / "domain.toml")
    # the deployment's own topic names and key (this test's broker), a huge ε to decode the
    # counts exactly; every user-level setting as the simulator wrote it
    s = _settings(kafka_broker, tmp_path, unique_name, KEY_1, epsilon=1e4)
    assert s.privacy_unit == "user"
    with _worker(s, tmp_path) as proc:
        stream_dp("replay", str(log), "--config", str(config), "--bootstrap", s.bootstrap,
                  "--topic", s.events_topic, "--key-file", s.key_file, "--until", UNTIL,
                  check=True)
        asyncio.run(wait_for_ticks(s, len(domain.names), TICKS, timeout_s=180, poll_s=0.5))
        assert proc.poll() is None, (tmp_path / f"{s.app_id}.log").read_text()[-3000:]
    dead = [json.loads(r.value) for r in asyncio.run(read_topic(s.bootstrap, s.dlq_topic))]
    assert not [d for d in dead if d.get("reason") in ("wrong_partition", "invalid_user")]

    events = [json.loads(line) for line in log.read_text().splitlines()]
    ticks = [(e["user"], math.floor((e["ts"] - s.origin) / s.tick_seconds) + 1, e["key"])
             for e in events]
    kept = [(e["key"], e["ts"], float(e["value"]))
            for e, keep in zip(events, keep_mask(ticks, user_bounds(s)), strict=True) if keep]
    assert len(kept) < len(events)
    exact = exact_decayed(domain, kept, s, TICKS)
    got = asyncio.run(released(s))
    for key, want in exact.items():
        msg = json.loads(got[key][0])
        assert abs(msg["value"] - want) <= bound_of(s) + 12 * msg["stderr"], (key, msg, want)
        assert msg["privacy"]["unit"] == "person"


def test_attribute_settings_with_people_are_user_level_too(tmp_path: Path) -> None:
    proc = stream_dp("simulate", "attributes", "--attributes", "8", "--ticks", "50",
                     "--people", "200", "--user-period-ticks", "10",
                     "--out", str(tmp_path / "a.jsonl"), "--domain-out", str(tmp_path / "d.toml"),
                     "--settings-out", str(tmp_path / "s.toml"), check=True)
    s = Settings.load(tmp_path / "s.toml", env={})
    log = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    k, dropped = _oracle_k(log, s.origin, s.tick_seconds, 10)
    assert (s.privacy_unit, s.user_period_ticks, s.user_max_events) == ("user", 10, k)
    assert f"K = {k} events per person per 10 ticks" in proc.stderr
    assert f"the bound drops {dropped:,} of {len(log):,} events" in proc.stderr
