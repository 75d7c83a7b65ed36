"""What `stream-dp replay` says about a second `--retime now` and about events after `--until`
(issue 32 item 9), run as a user runs it against the real (embedded) broker.

A second `--retime now` of a completely replayed log said "Nothing to do; --restart replays it
again" and that the same log reproduces "the original releases" — but --restart is refused (a new
shift) and a retimed run reproduces no original release. The refusal then showed the same file's
hash prefix twice. Each test has its own replay history (tests/conftest.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration._users import create_topic, stream_dp

pytestmark = pytest.mark.integration

KEY = "d29c41e7a05f3b86c1e4d7a29f03b5c8e61d4a7f2b09c3e5d81a6f4b27c0e9d3"  # hex, 32 random bytes
LOG = ("ts,key\n2024-01-01T00:00:00Z,a\n2024-01-01T00:00:00.500Z,b\n"
       "2024-01-01T00:00:01.250Z,a\n2024-01-01T00:00:03.750Z,b\n")


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_a_second_retime_now_says_what_happens_and_how_to_reproduce(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "burst.csv"
    log.write_text(LOG, encoding="utf-8")
    env = {"STREAM_DP_KEY": KEY}
    common = ["--bootstrap", kafka_broker, "--topic", unique_name, "--no-close-markers",
              "--no-progress"]
    first = stream_dp("replay", str(log), "--retime", "now", *common, env=env, check=True)
    shift = re.search(r"retimed by ([+-]\d+\.\d{3}) s", first.stderr)
    assert shift, first.stderr

    # the same command again: nothing is sent, and it says why a new shift cannot be replayed
    again = stream_dp("replay", str(log), "--retime", "now", *common, env=env)
    assert again.returncode == 0, again.stderr
    text = " ".join(_lines(again.stderr))
    assert "Nothing sent" in text and "--retime now asks for a new shift" in text, text
    assert f"only retimed {shift.group(1)} s" in text, text
    assert "--restart replays it again" not in text and "original releases" not in text, text

    # with --restart: refused, naming this very log and both shifts, one hash at most
    refused = stream_dp("replay", str(log), "--retime", "now", "--restart", *common, env=env)
    assert refused.returncode == 3, refused.stderr
    lines = _lines(refused.stderr)
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "already replayed this very log" in lines[0], lines[0]
    assert f"retimed {shift.group(1)} s" in lines[0], lines[0]
    assert lines[0].count("SHA-256") <= 1, lines[0]
    suggested = re.search(r"\(--retime (\S+)\)", lines[0])
    assert suggested, lines[0]

    # the suggested --retime reproduces the earlier shift: accepted as the same content
    same = stream_dp("replay", str(log), "--retime", suggested.group(1), "--restart", *common,
                     env=env)
    assert same.returncode == 0, same.stderr
    assert f"same --retime shift ({shift.group(1)} s)" in same.stderr, same.stderr
    assert "NEW releases" not in same.stderr


def test_events_after_until_note_says_the_tick_containing_it_is_released(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """The final marker closes the whole tick that contains --until: events after --until in
    that tick are released with it; the note said they all "stay open"."""
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "old.csv"
    log.write_text(LOG, encoding="utf-8")
    proc = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                     "--until", "2024-01-01T00:00:01Z", "--no-progress",
                     env={"STREAM_DP_KEY": KEY}, check=True)
    note = next((ln for ln in _lines(proc.stderr) if ln.startswith("note: events after")), "")
    assert "those in the tick containing it are released with that tick" in note, proc.stderr
    assert "those in later ticks stay open" in note, note
