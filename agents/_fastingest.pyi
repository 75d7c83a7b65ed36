"""Type stub of the compiled ingest fast path (agents/csrc/fastingest.c)."""

from collections.abc import Sequence
from typing import Any

class Scanner:
    def __init__(
        self, dkey: bytes, max_bytes: int, max_value: float, cap: float, inv_unit: float,
        cap_u: int, origin: float, tick_seconds: float, lateness: float, grace: float,
        skew: float, max_age: float, markers: bool, whole: bool,
    ) -> None: ...
    def scan(
        self, records: Sequence[Any], start: int, next_tick: int, stop_offset: int,
        horizon_ts: float, lat_active: bool, buckets: dict[int, dict[Any, int]],
        declared: dict[str, Any], /,
    ) -> tuple[int, int, int, int]: ...

def blake2b(key: bytes, data: bytes, digest_size: int = 16, /) -> bytes: ...
def parse_event(raw: bytes, /) -> tuple[str, float, float] | None: ...
