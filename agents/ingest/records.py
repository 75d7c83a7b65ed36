"""The records ingest reads and how they are decoded: :class:`Record`, the compiled fast path
(``agents.ingest._fastingest``: :data:`FAST_PATH_STATUS`, ``RecordBlock``) and the JSON codecs of
internal records.

How the compiled and the pure-Python paths relate: :mod:`agents.ingest.processing`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = [
    "FAST_PATH_STATUS",
    "_NO_STOP",
    "Record",
    "RecordBlock",
    "_fast_dumps",
    "_fast_loads",
    "_fastingest",
]

#: "no closing point pending" for the compiled scanner (an offset no record reaches)
_NO_STOP = (1 << 63) - 1

#: The compiled fast path of :meth:`IngestState.process_batch` (``agents/ingest/csrc/fastingest.c``,
#: built by ``pip install``). ``None`` when it did not build or import, or when the environment
#: sets ``STREAM_DP_PURE_INGEST=1``: then the pure-Python path (authoritative; identical
#: results, a property test compares them) does everything. :data:`FAST_PATH_STATUS` says which,
#: in one line (logged at start-up).
_fastingest: Any
#: ``agents.ingest._fastingest.RecordBlock`` (one fetched record batch read in place), or ``None``
RecordBlock: Any = None


try:
    if os.environ.get("STREAM_DP_PURE_INGEST", "") not in ("", "0"):
        raise ImportError("disabled by STREAM_DP_PURE_INGEST")
    from agents.ingest import _fastingest
except ImportError as _exc:
    _fastingest = None
    FAST_PATH_STATUS = f"ingest: pure-Python path (compiled fast path unavailable: {_exc})"
else:
    FAST_PATH_STATUS = "ingest: compiled fast path (agents.ingest._fastingest)"
    RecordBlock = _fastingest.RecordBlock


try:  # orjson parses ~5x faster; the stdlib decoder (and decode_event) stays authoritative
    from orjson import OPT_SERIALIZE_NUMPY as _OPT_SERIALIZE_NUMPY
    from orjson import dumps as _orjson_dumps
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency of the service extra
    _orjson_dumps = None  # type: ignore[assignment]
    _OPT_SERIALIZE_NUMPY = 0
    _std = json.JSONDecoder().raw_decode

    def _fast_loads(raw: bytes | bytearray | memoryview | str, /) -> Any:
        text = raw if isinstance(raw, str) else bytes(raw).decode()
        obj, end = _std(text)
        if end != len(raw):
            raise ValueError("not a single JSON value")
        return obj


def _fast_dumps(obj: Any, *, numpy: bool = False) -> bytes:
    """Compact JSON of internal records (partials, ingest checkpoints; their numbers are finite
    by validation): orjson, else the stdlib with the same separators. ``numpy``: ``obj`` may
    hold 1-d int64 arrays, written as the same JSON as their ``tolist()`` (without making a
    Python int per element: the ingest checkpoint's bucket columns)."""
    if _orjson_dumps is not None:
        out: bytes = (_orjson_dumps(obj, option=_OPT_SERIALIZE_NUMPY) if numpy
                      else _orjson_dumps(obj))
        return out
    return json.dumps(obj, separators=(",", ":"), allow_nan=False,  # pragma: no cover
                      default=_tolist if numpy else None).encode()


def _tolist(obj: Any) -> Any:
    """The stdlib encoder's fall-back for arrays (``_fast_dumps(..., numpy=True)``)."""
    tolist = getattr(obj, "tolist", None)
    if tolist is None:
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")
    return tolist()


class Record(NamedTuple):
    """One input record (the attributes of aiokafka's ``ConsumerRecord`` that ingest uses).

    ``timestamp`` is the Kafka record timestamp in milliseconds, ``timestamp_type`` 0 for
    CreateTime (set by the producer) and 1 for LogAppendTime (set by the broker).
    """

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = -1
    timestamp_type: int = 0
    headers: Sequence[tuple[str, bytes]] = ()


if _fastingest is not None:  # the records a RecordBlock builds for the pure path
    _fastingest.set_record_factory(Record)
