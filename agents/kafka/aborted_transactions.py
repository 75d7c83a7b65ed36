"""``read_committed`` fetches that no longer lose committed records behind an old abort.

A fetch response lists the aborted transactions of the fetched range as ``(producer id, first
offset)``; the client skips a producer's batches from that first offset until it meets the
producer's ABORT marker. Kafka lists only transactions whose marker lies at or after the fetch
offset. **noida-db 0.2.3 also lists transactions that ended before it** (measured: an ingest
producer's transaction at offsets 0..59 of a partials partition, aborted by the next worker's
fencing, its marker at 60, is still listed for fetches from offsets 61, 150 and 182). A fetch that
starts past that marker never meets it, so the client skips every later batch of the producer —
and a restarted producer keeps its id (a new epoch), so its *committed* transactions vanish: a
release shard then waited for ever for one events partition's partials and the worker stopped
with a false "the broker lost records" (exit status 4; the kill -9 test, 1 run in about 20 under
load).

:func:`install` makes every consumer of the process decide such a listing from the fetched
batches themselves. Only a listed transaction that starts *before* the fetch offset can be stale;
for its producer the first control batch at or after the fetch offset tells which it is:

* an ABORT marker — the listed transaction is still open at the fetch offset (Kafka's case): kept,
  its batches skipped as before;
* a COMMIT marker — the producer's batches from the fetch offset belong to a later, committed
  transaction, so the listed one ended before the fetch offset: dropped, the batches delivered;
* no marker in the response but batches of the producer — undecidable here: the records are
  handed out only up to the first such batch, so the next fetch starts at it and sees its
  transaction's marker (when nothing before that batch moves the position past the fetch offset,
  the listing is kept: Kafka's behaviour; on noida-db a transaction longer than a whole fetch
  response can then still be skipped, and the worker stops as for a lost record).

A response the pre-scan cannot read (a damaged or empty control batch) is handed out unchanged,
with its listing, for aiokafka to read or refuse as it would — or, when a listing was already found
stale before that batch, up to the batch, so the next fetch starts there. Batches of an old
message format carry no producer: nothing to decide. Another patch of the
same class (:mod:`agents.ingest.raw_records`) may wrap this one in either order: the batches
handed on keep the fetched bytes (``raw``) and start with the response's first batch.

On a broker that lists transactions as Kafka does, no listing is dropped (a transaction open at
the fetch offset ends with ABORT) and records are never delivered that Kafka's client would skip;
responses without such a listing are not touched. aiokafka is pinned (pyproject.toml): the
patched class is aiokafka 0.14's ``PartitionRecords``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["install", "resolve"]

_state: dict[str, Any] = {"installed": False}


class _Batches:
    """What is handed out of a fetch response's ``MemoryRecords``: the batches the pre-scan
    read (those before the cut), then (``rest``) the ones it did not; ``raw``: the response's
    bytes, when the records object kept them."""

    def __init__(self, batches: list[Any], rest: Any = None, raw: Any = None) -> None:
        self._batches = batches
        self._i = 0
        self._rest = rest
        self.raw = raw

    def has_next(self) -> bool:
        return self._i < len(self._batches) or (
            self._rest is not None and bool(self._rest.has_next()))

    def next_batch(self) -> Any:
        if self._i < len(self._batches):
            batch = self._batches[self._i]
            self._batches[self._i] = None  # handed out: not kept while the rest is read
            self._i += 1
            return batch
        return self._rest.next_batch() if self._rest is not None else None


class _Unreadable(Exception):
    """A batch the pre-scan must not decide on (aiokafka reads or refuses it)."""


def resolve(batches: list[tuple[int | None, int, int, bool, bool | None]],
            aborted: list[tuple[int, int]], fetch_offset: int
            ) -> tuple[list[tuple[int, int]], int]:
    """The aborted-transaction listing to apply, and how many batches to hand out.

    ``batches`` in response order as ``(producer id, base offset, next offset, transactional,
    abort)`` where ``abort`` is ``True`` / ``False`` for an ABORT / COMMIT control batch and
    ``None`` for a data batch; ``aborted`` the response's ``(producer id, first offset)`` list.

    >>> data = (7, 61, 62, True, None); commit = (7, 62, 63, True, False)
    >>> resolve([data, commit], [(7, 0)], 61)          # ended before 61: stale
    ([], 2)
    >>> resolve([data, (7, 62, 63, True, True)], [(7, 0)], 61)   # open at 61: kept
    ([(7, 0)], 2)
    >>> resolve([(8, 61, 62, True, None), data], [(7, 0)], 61)   # undecidable: cut before 7's
    ([(7, 0)], 1)
    >>> resolve([(8, 58, 61, True, None), data], [(7, 0)], 61)   # the cut would not move on
    ([(7, 0)], 2)
    """
    early = {pid for pid, first in aborted if first < fetch_offset}
    if not early:
        return aborted, len(batches)
    decided: dict[int, bool] = {}  # producer -> its first marker from the fetch offset is ABORT
    first_data: dict[int, int] = {}
    for i, (pid, base, end, transactional, abort) in enumerate(batches):
        if pid is None or pid not in early or pid in decided:
            continue
        if abort is not None:
            if base >= fetch_offset:
                decided[pid] = abort
        elif transactional and end > fetch_offset:
            first_data.setdefault(pid, i)
    stale = {pid for pid, abort in decided.items() if not abort}
    kept = [(pid, first) for pid, first in aborted if not (pid in stale and first < fetch_offset)]
    undecided = [i for pid, i in first_data.items() if pid not in decided]
    cut = min(undecided) if undecided else len(batches)
    # a cut must move the position on: else the next fetch is this one again
    if cut < len(batches) and not any(end > fetch_offset for _, _, end, _, _ in batches[:cut]):
        cut = len(batches)
    return kept, cut


def _describe(batch: Any, markers: dict[int, bool], check_crcs: bool
              ) -> tuple[int | None, int, int, bool, bool | None]:
    if batch.producer_id is None:  # no producer (an old message format): nothing to decide
        return (None, -1, -1, False, None)
    abort: bool | None = None
    if batch.is_control_batch:
        from aiokafka.record.control_record import ABORT_MARKER, ControlRecord

        if check_crcs and not batch.validate_crc():
            raise _Unreadable("damaged control batch")
        try:
            record = next(batch)
        except StopIteration:
            raise _Unreadable("empty control batch") from None
        abort = ControlRecord.parse(record.key) == ABORT_MARKER
        markers[int(batch.base_offset)] = abort
    return (batch.producer_id, int(batch.base_offset), int(batch.next_offset),
            bool(batch.is_transactional), abort)


def install() -> None:
    """Decide every listed aborted transaction that starts before the fetch offset from the
    fetched batches (module docstring), for every ``read_committed`` consumer of the process.
    Idempotent."""
    if _state["installed"]:
        return
    from aiokafka.consumer import fetcher

    base = fetcher.PartitionRecords

    class PartitionRecords(base):  # type: ignore[misc,valid-type]
        def __init__(self, tp: Any, records: Any, aborted_transactions: Any, fetch_offset: int,
                     key_deserializer: Any, value_deserializer: Any, check_crcs: bool,
                     isolation_level: int) -> None:
            # the control batches read here (their one record consumed) answer
            # _contains_abort_marker from this map
            self._stream_dp_markers: dict[int, bool] = {}
            aborted = list(aborted_transactions or [])
            if isolation_level == fetcher.READ_COMMITTED and any(first < fetch_offset
                                                                 for _, first in aborted):
                raw = getattr(records, "raw", None)
                batches: list[Any] = []
                described: list[tuple[int | None, int, int, bool, bool | None]] = []
                try:
                    while records.has_next():
                        batch = records.next_batch()
                        if batch is None:
                            break
                        batches.append(batch)
                        described.append(_describe(batch, self._stream_dp_markers,
                                                   bool(check_crcs)))
                except Exception:  # aiokafka reads or refuses that batch, as it would
                    # a listing found stale before it stays dropped: hand out up to the batch
                    # (the next fetch starts there), if that moves the position on
                    kept, cut = resolve(described, aborted, fetch_offset)
                    if kept != aborted and any(end > fetch_offset
                                               for _, _, end, _, _ in described[:cut]):
                        aborted, records = kept, _Batches(batches[:cut], raw=raw)
                    else:
                        records = _Batches(batches, rest=records, raw=raw)
                else:
                    aborted, cut = resolve(described, aborted, fetch_offset)
                    records = _Batches(batches[:cut], raw=raw)
            super().__init__(tp, records, aborted, fetch_offset, key_deserializer,
                             value_deserializer, check_crcs, isolation_level)

        def _contains_abort_marker(self, next_batch: Any) -> bool:
            known = self._stream_dp_markers.get(int(next_batch.base_offset))
            if known is not None:
                return known
            return bool(super()._contains_abort_marker(next_batch))

    fetcher.PartitionRecords = PartitionRecords
    _state["installed"] = True
