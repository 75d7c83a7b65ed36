"""Committed reads past stale aborted-transaction listings (agents.kafka.aborted_transactions).

Real aiokafka record batches (data and control) are built for random partition logs of
interleaved transactions; consumers fetch them from random offsets in truncated responses through
aiokafka's own ``PartitionRecords`` — patched and not — and what they hand out is compared with
the log's committed records, known by construction (the oracle).
"""

from __future__ import annotations

import doctest
import random
import struct
from dataclasses import dataclass, field

import pytest
from aiokafka.consumer import fetcher

# the Python builder: the compiled one cannot be subclassed to set the control bit
from aiokafka.record.default_records import (
    _DefaultRecordBatchBuilderPy as DefaultRecordBatchBuilder,
)
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from agents.kafka import aborted_transactions

aborted_transactions.install()
PATCHED = fetcher.PartitionRecords
ORIGINAL = PATCHED.__mro__[1]
TP = TopicPartition("t", 0)


class _ControlBuilder(DefaultRecordBatchBuilder):
    def _get_attributes(self, include_compression_type: bool = True) -> int:
        return super()._get_attributes(include_compression_type) | self.CONTROL_MASK


def _batch(base: int, pid: int, n: int, *, transactional: bool,
           control: bool | None = None) -> bytes:
    """``n`` records at offsets base.. (a control batch: one ABORT (True) / COMMIT (False))."""
    cls = _ControlBuilder if control is not None else DefaultRecordBatchBuilder
    b = cls(magic=2, compression_type=0, is_transactional=int(transactional),
            producer_id=pid, producer_epoch=0, base_sequence=0, batch_size=1 << 20)
    for i in range(n):
        if control is not None:
            b.append(i, timestamp=1, key=struct.pack(">hh", 0, 0 if control else 1),
                     value=b"", headers=[])
        else:
            b.append(i, timestamp=1, key=None, value=b"%d" % (base + i), headers=[])
    raw = bytearray(b.build())
    raw[0:8] = struct.pack(">q", base)  # the base offset: outside the CRC
    return bytes(raw)


@dataclass
class Log:
    """A partition: its batches in offset order and what a committed reader must see."""

    batches: list[tuple[int, int, bytes]] = field(default_factory=list)  # (base, next, bytes)
    committed: set[int] = field(default_factory=set)
    #: (producer id, first offset, marker offset) of every aborted transaction
    aborted: list[tuple[int, int, int]] = field(default_factory=list)
    longest: int = 1  # batches from a transaction's first to its marker, at most


def _end(log: Log, offset: int, pid: int, tx: tuple[int, int, list[int]], abort: bool) -> int:
    """Write the marker of ``pid``'s transaction ``tx`` at ``offset``; the next offset."""
    first, first_batch, offs = tx
    log.batches.append((offset, offset + 1, _batch(offset, pid, 1, transactional=True,
                                                   control=abort)))
    if abort:
        log.aborted.append((pid, first, offset))
    else:
        log.committed.update(offs)
    log.longest = max(log.longest, len(log.batches) - first_batch)
    return offset + 1


def random_log(rng: random.Random) -> Log:
    log = Log()
    offset = 0
    open_tx: dict[int, tuple[int, int, list[int]]] = {}  # pid -> (first, first batch, offsets)
    for _ in range(rng.randint(4, 40)):
        pid = rng.choice([1001, 1002, 1003, -1])
        if pid == -1:  # a plain (non-transactional) producer
            n = rng.randint(1, 3)
            log.batches.append((offset, offset + n, _batch(offset, 1, n, transactional=False)))
            log.committed.update(range(offset, offset + n))
            offset += n
        elif pid in open_tx and rng.random() < 0.45:
            offset = _end(log, offset, pid, open_tx.pop(pid), rng.random() < 0.5)
        else:
            n = rng.randint(1, 3)
            if pid not in open_tx:
                open_tx[pid] = (offset, len(log.batches), [])
            open_tx[pid][2].extend(range(offset, offset + n))
            log.batches.append((offset, offset + n, _batch(offset, pid, n, transactional=True)))
            offset += n
    for pid, tx in open_tx.items():  # close them all: a response lies below the LSO
        offset = _end(log, offset, pid, tx, rng.random() < 0.5)
    return log


def read(log: Log, start: int, limit: int, cls: type, *, stale: bool) -> list[int]:
    """Offsets handed out reading from ``start`` to the end, ``limit`` batches a response; the
    listing as Kafka sends it, or (``stale``) with every earlier aborted transaction too."""
    end = log.batches[-1][1]
    pos, out = start, []
    for _ in range(10 * len(log.batches) + 10):
        if pos >= end:
            return out
        chosen = [b for b in log.batches if b[1] > pos][:limit]
        last = chosen[-1][1]
        listing = [(pid, first) for pid, first, marker in log.aborted
                   if first < last and (stale or marker >= pos)]
        rng = random.Random(pos)
        rng.shuffle(listing)  # order is the client's business
        records = MemoryRecords(b"".join(raw for _, _, raw in chosen))
        part = cls(TP, records, listing, pos, None, None, True, fetcher.READ_COMMITTED)
        out.extend(r.offset for r in part)
        assert part.next_fetch_offset > pos, "no progress"
        pos = part.next_fetch_offset
    raise AssertionError("the reader did not reach the end")


@pytest.mark.parametrize("seed", range(300))
def test_committed_reads_from_any_offset(seed: int) -> None:
    rng = random.Random(seed)
    log = random_log(rng)
    end = log.batches[-1][1]
    start = rng.randrange(0, end)
    # a response holds at least one whole transaction (else a listing can be undecidable)
    limit = rng.randint(log.longest, log.longest + 6)
    want = sorted(o for o in log.committed if o >= start)
    # a broker that lists transactions as Kafka does: the same records as aiokafka's own reader
    kafka_patched = read(log, start, limit, PATCHED, stale=False)
    assert kafka_patched == read(log, start, limit, ORIGINAL, stale=False) == want
    # stale listings (noida-db 0.2.3): still exactly the committed records
    assert read(log, start, limit, PATCHED, stale=True) == want


def test_stale_listings_lose_records_without_the_patch() -> None:
    """The case the module exists for, seen through aiokafka's unpatched reader: a fetch past
    an aborted transaction's marker, then a committed one of the same producer."""
    log = Log()
    raw = [_batch(0, 7, 3, transactional=True), _batch(3, 7, 1, transactional=True, control=True),
           _batch(4, 7, 2, transactional=True), _batch(6, 7, 1, transactional=True, control=False)]
    log.batches = [(0, 3, raw[0]), (3, 4, raw[1]), (4, 6, raw[2]), (6, 7, raw[3])]
    log.committed = {4, 5}
    log.aborted = [(7, 0, 3)]
    assert read(log, 4, 10, ORIGINAL, stale=True) == []
    assert read(log, 4, 10, PATCHED, stale=True) == [4, 5]
    assert read(log, 0, 10, PATCHED, stale=True) == [4, 5]
    # inside the aborted transaction (Kafka lists it then): nothing of it
    assert read(log, 1, 10, PATCHED, stale=False) == [4, 5]


def test_an_undecidable_listing_stops_the_response_before_the_producer() -> None:
    log = Log()
    raw = [_batch(0, 7, 2, transactional=True), _batch(2, 7, 1, transactional=True, control=True),
           _batch(3, 8, 2, transactional=False), _batch(5, 7, 2, transactional=True),
           _batch(7, 7, 1, transactional=True, control=False)]
    log.batches = [(0, 2, raw[0]), (2, 3, raw[1]), (3, 5, raw[2]), (5, 7, raw[3]), (7, 8, raw[4])]
    records = MemoryRecords(b"".join(raw[2:4]))  # truncated before 7's COMMIT
    part = PATCHED(TP, records, [(7, 0)], 3, None, None, True, fetcher.READ_COMMITTED)
    assert [r.offset for r in part] == [3, 4]
    assert part.next_fetch_offset == 5  # the next fetch starts at producer 7's batch
    records = MemoryRecords(b"".join(raw[3:5]))
    part = PATCHED(TP, records, [(7, 0)], 5, None, None, True, fetcher.READ_COMMITTED)
    assert [r.offset for r in part] == [5, 6]


def test_install_is_idempotent_and_the_examples_hold() -> None:
    aborted_transactions.install()
    assert fetcher.PartitionRecords is PATCHED
    assert doctest.testmod(aborted_transactions).failed == 0


# Both patches of PartitionRecords, in either order (the worker installs this one first, the
# ingest stage agents.ingest.raw_records when its consumer starts): a raw_records consumer's
# record blocks hold exactly the committed records. Each order in its own interpreter (an
# install is for the whole process).
_BOTH_ORDERS = r'''
import random, sys
from agents.ingest import raw_records
from agents.ingest.records import RecordBlock
from agents.kafka import aborted_transactions
if sys.argv[1] == "worker":
    aborted_transactions.install(); raw_records.install()
else:
    raw_records.install(); aborted_transactions.install()
from aiokafka.consumer import fetcher
from tests.unit.agents.kafka import test_aborted_transactions as t
assert RecordBlock is not None
# an old-format (v1) batch: decoded by aiokafka, the position moves on
from aiokafka.record.legacy_records import _LegacyRecordBatchBuilderPy
b = _LegacyRecordBatchBuilderPy(magic=1, compression_type=0, batch_size=1 << 20)
b.append(0, timestamp=1, key=None, value=b"v")
legacy = bytearray(b.build()); legacy[0:8] = (6).to_bytes(8, "big")
for listing in ([], [(7, 0)]):
    part = fetcher.PartitionRecords(t.TP, fetcher.MemoryRecords(bytes(legacy)), listing, 6, None,
                                    raw_records.raw_records, True, fetcher.READ_COMMITTED)
    assert [r.offset for r in part] == [6] and part.next_fetch_offset == 7, listing
blocks = 0
for seed in range(150):
    rng = random.Random(seed)
    log = t.random_log(rng)
    end = log.batches[-1][1]
    start = rng.randrange(0, end)
    limit = rng.randint(log.longest, log.longest + 6)
    want = sorted(o for o in log.committed if o >= start)
    for stale in (False, True):
        pos, out = start, []
        for _ in range(10 * len(log.batches) + 10):
            if pos >= end:
                break
            chosen = [b for b in log.batches if b[1] > pos][:limit]
            last = chosen[-1][1]
            listing = [(pid, first) for pid, first, marker in log.aborted
                       if first < last and (stale or marker >= pos)]
            part = fetcher.PartitionRecords(
                t.TP, fetcher.MemoryRecords(b"".join(raw for _, _, raw in chosen)), listing,
                pos, None, raw_records.raw_records, True, fetcher.READ_COMMITTED)
            for item in part:
                if type(item) is RecordBlock:
                    blocks += 1
                    out.extend(item[j].offset for j in range(len(item)))
                else:
                    out.append(item.offset)
            assert part.next_fetch_offset > pos, (seed, "no progress")
            pos = part.next_fetch_offset
        assert out == want, (seed, stale, out, want)
assert blocks > 0
print("ok", blocks)
'''


@pytest.mark.parametrize("order", ["worker", "reversed"])
def test_with_the_ingest_record_blocks_in_either_order(order: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    from agents.ingest.records import RecordBlock

    if RecordBlock is None:
        pytest.skip("no compiled fast path")
    root = Path(__file__).resolve().parents[4]
    proc = subprocess.run([sys.executable, "-c", _BOTH_ORDERS, order], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_an_old_message_format_is_read_as_aiokafka_reads_it() -> None:
    from aiokafka.record.legacy_records import _LegacyRecordBatchBuilderPy

    b = _LegacyRecordBatchBuilderPy(magic=1, compression_type=0, batch_size=1 << 20)
    for i in range(3):
        b.append(i, timestamp=1, key=None, value=b"v%d" % i)
    raw = bytearray(b.build())
    raw[0:8] = struct.pack(">q", 6)  # a one-record-per-message format: offsets 6, then 1, 2
    for cls in (ORIGINAL, PATCHED):
        part = cls(TP, MemoryRecords(bytes(raw)), [(7, 0)], 6, None, None, True,
                   fetcher.READ_COMMITTED)
        assert [r.value for r in part][:1] == [b"v0"]


def test_a_damaged_control_batch_is_refused_as_aiokafka_refuses_it() -> None:
    from aiokafka.errors import CorruptRecordException

    data = _batch(4, 7, 2, transactional=True)
    marker = bytearray(_batch(6, 7, 1, transactional=True, control=False))
    marker[-1] ^= 0xFF  # the control record's last byte: the CRC no longer matches
    for cls in (ORIGINAL, PATCHED):
        part = cls(TP, MemoryRecords(data + bytes(marker)), [(7, 0)], 4, None, None, True,
                   fetcher.READ_COMMITTED)
        with pytest.raises(CorruptRecordException):
            list(part)


def test_what_was_decided_before_an_unreadable_batch_still_holds() -> None:
    """A stale listing decided by a COMMIT, then a damaged marker: the records before it are
    handed out and the next fetch starts at the damaged batch (refused there, as aiokafka
    refuses it)."""
    from aiokafka.errors import CorruptRecordException

    damaged = bytearray(_batch(8, 9, 1, transactional=True, control=True))
    damaged[-1] ^= 0xFF
    raw = (_batch(4, 7, 2, transactional=True) + _batch(6, 7, 1, transactional=True, control=False)
           + _batch(7, 9, 1, transactional=True) + bytes(damaged))
    part = PATCHED(TP, MemoryRecords(raw), [(7, 0)], 4, None, None, True, fetcher.READ_COMMITTED)
    assert [r.offset for r in part] == [4, 5, 7]
    assert part.next_fetch_offset == 8
    part = PATCHED(TP, MemoryRecords(bytes(damaged)), [(7, 0)], 8, None, None, True,
                   fetcher.READ_COMMITTED)
    with pytest.raises(CorruptRecordException):
        list(part)
