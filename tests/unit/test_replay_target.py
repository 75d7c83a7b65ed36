"""What `stream-dp replay` reads from the end of the events topic before sending (issue #24):
a final close marker of an earlier replay under this key or another, and the one-line refusal."""

from __future__ import annotations

from agents.codec import close_marker, marker_key
from agents.commands._replay_target import EarlierFinal, _final, refusal, unverified_note

MINE = marker_key(b"m" * 32)
OTHER = marker_key(b"o" * 32)
T = 1704067230.0


def _end(mac: bytes, final: bool, topic: str = "ev", partition: int = 1
         ) -> tuple[bytes, dict[str, bytes]]:
    headers, value = close_marker(T, final, mac_key=mac, topic=topic, partition=partition)
    return value, dict(headers)


def test_a_final_marker_is_found_and_its_key_told_apart() -> None:
    assert _final(*_end(MINE, True), MINE, "ev", 1) == (T, True)
    assert _final(*_end(OTHER, True), MINE, "ev", 1) == (T, False)  # another deployment key
    # a progress marker closes nothing for good: not a reason to refuse
    assert _final(*_end(MINE, False), MINE, "ev", 1) is None
    assert _final(*_end(OTHER, False), MINE, "ev", 1) is None
    # copied to another partition: it does not verify here (counted as another key's)
    assert _final(*_end(MINE, True, partition=0), MINE, "ev", 1) == (T, False)
    # an event, or a record with the close header that is no marker
    assert _final(b'{"key": "a", "ts": 1}', {}, MINE, "ev", 1) is None
    assert _final(b"not json", {"stream-dp-close": b"1"}, MINE, "ev", 1) is None
    assert _final(b'{"schema": "dp.close.v2", "final": true, "time": "x"}',
                  {"stream-dp-close": b"1"}, MINE, "ev", 1) is None


def test_the_refusal_is_one_line_and_only_for_events_the_marker_closed() -> None:
    mine = EarlierFinal(T, True, 2)
    why = refusal(mine, "ev", T - 30)
    assert why is not None and "\n" not in why
    assert "ev already holds the final close marker" in why and "2024-01-01T00:00:30Z" in why
    assert "signed with this key" in why and "tick_closed" in why and "nothing was sent" in why
    assert refusal(mine, "ev", T + 0.001) is None  # a log after the earlier end
    # a final marker this key does not verify (another key's, or forged): never a refusal,
    # only a one-line note (issue #32)
    unverified = EarlierFinal(T, False, 1)
    assert refusal(unverified, "ev", T) is None
    note = unverified_note(unverified, "ev", T)
    assert note is not None and "\n" not in note and "decides nothing" in note
    assert "forged_marker" in note and "another noise key" in note
    assert unverified_note(mine, "ev", T) is None
    assert unverified_note(unverified, "ev", T + 0.001) is None


def test_adv_a_hostile_writers_future_final_marker_does_not_block_every_replay() -> None:
    """Any writer of the events topic can append a record with the close header and an
    unverifiable "final" marker body. With a time far in the future it made every replay into
    the topic refuse (every log's first event lies before it), blaming another noise key. No
    replay writes a final marker in the future (--until in the future is refused), so such a
    marker is ignored; one in the past is only noted (issue #32: it decides nothing)."""
    import json
    import time

    from agents.codec import CLOSE_SCHEMA

    headers = {"stream-dp-close": b"1"}
    future = json.dumps({"schema": CLOSE_SCHEMA, "final": True,
                         "time": time.time() + 86400 * 365 * 50}).encode()
    assert _final(future, headers, MINE, "ev", 1) is None
    past = json.dumps({"schema": CLOSE_SCHEMA, "final": True, "time": T}).encode()
    assert _final(past, headers, MINE, "ev", 1) == (T, False)
    assert refusal(EarlierFinal(T, False, 1), "ev", T) is None
