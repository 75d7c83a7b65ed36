"""Release stage state for one shard (pure: no I/O; the pipeline does the Kafka part).

A shard owns a fixed set of declared streams (:class:`agents.ingest.routing.Router`) and one
:class:`stream_dp.counters.CounterBank` for them. Tick ``n`` is released once partials for
``n`` from **all** events partitions are in: they are summed in source-partition order (so the
float sums are bit-identical on every replay), the bank steps over every stream of the shard
(zeros included), and one ``dp.counts.v1`` message per stream is produced.

State (bank bytes, next tick, pending partials of later ticks, input offset) round-trips through
:meth:`ReleaseState.to_bytes`; together with noise keyed by ``(secret, mechanism, domain, epoch,
stream, node)`` a replay from a checkpoint republishes bit-identical values.

**Authenticated checkpoints.** :meth:`ReleaseState.to_bytes` is sealed with
:func:`stream_dp.integrity.seal` (HMAC-SHA256 under a key derived from the noise secret) and bound
to :meth:`ReleaseState.context`: the full mechanism description, the domain digest, the epoch,
the shard and the shard/partition counts and tick schedule. :meth:`ReleaseState.restore` raises
:class:`CheckpointRefused` for a changed byte, another key or another configuration; the worker
treats it as fatal (it does not start with that state, and does not retry).

**Numbers out of range.** A count beyond the strategy's numeric range makes
:meth:`ReleaseState.step` raise :class:`ReleaseOverflow` (state unchanged); the worker counts it
(metric ``stream_dp_release_errors_total{reason="overflow"}``), logs it and stops: retrying
would fail the same way forever.
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agents.config.settings import Settings
from agents.ingest.routing import Partial, Router, _int_list
from agents.kafka.checkpoints import CheckpointRefused
from agents.kafka.codec import encode
from stream_dp.compact import encode_block, encode_manifest, manifest_hash
from stream_dp.contributions import clip_limit_units, value_unit
from stream_dp.integrity import IntegrityError, seal, unseal
from stream_dp.mechanism import canonical_json

__all__ = [
    "CHECKPOINT_PURPOSE",
    "PROGRESS_PURPOSE",
    "CheckpointRefused",
    "Release",
    "ReleaseOverflow",
    "ReleaseState",
    "build_mechanism",
    "forget_picks",
]

_MAGIC = b"SDPREL2\n"
#: :func:`stream_dp.integrity.seal` purpose of release-stage checkpoints.
CHECKPOINT_PURPOSE = "release checkpoint"
#: :func:`stream_dp.integrity.seal` purpose of the progress records between full checkpoints.
PROGRESS_PURPOSE = "release progress"


def build_mechanism(settings: Settings) -> Any:
    """The deployment's mechanism; ``ValueError`` if ``cap × max_events_per_tick`` can exceed
    its numeric range. ``auto`` picks among the strategies whose range covers it."""
    from stream_dp.planner import check_range, make_mechanism

    s = settings
    limit = s.cap * s.max_events_per_tick
    strategy = s.strategy
    bounds = _bounds_of(s)
    if strategy == "auto":
        strategy = _auto(s.p, s.horizon, s.privacy, s.cap, limit, bounds)
    # a user-level deployment runs the registry's user-level mechanism (blt: no start rows)
    mech = make_mechanism(strategy, s.p, s.horizon, s.privacy, s.cap, user_bounds=bounds)
    check_range(mech, limit, what=f"cap × max_events_per_tick = {s.cap:g} × "
                                  f"{s.max_events_per_tick}")
    return mech


def _bounds_of(settings: Settings) -> Any:
    """The person's bounds of a user-level deployment (``auto`` then ranks the strategies by
    the error at the user-level calibration, as ``stream-dp plan --privacy-unit user``)."""
    if settings.privacy_unit != "user":
        return None
    from agents.ingest.users import user_bounds

    return user_bounds(settings)


def forget_picks() -> None:
    """Forget ``auto``'s picks (after the deployment's recorded fits were pinned: the errors
    they rank by may have changed)."""
    _auto.cache_clear()


@functools.lru_cache(maxsize=16)
def _auto(p: float, horizon: int, privacy: Any, cap: float, limit: float, bounds: Any) -> str:
    # ranking by the user-level error computes every strategy's exact per-person factor (up to
    # seconds): once per process, not once per shard
    from stream_dp.planner import pick

    return str(pick(p, horizon, privacy, cap=cap, max_tick_count=limit, user_bounds=bounds))


class ReleaseOverflow(ValueError):
    """A tick's counts are beyond the strategy's numeric range (state unchanged). Fatal: a
    retry would fail the same way."""


@dataclass(frozen=True)
class Release:
    """One shard's release for one tick (noisy values only; never raw counts)."""

    tick: int
    tick_start: float
    tick_end: float
    shard: int
    streams: tuple[str, ...]
    values: NDArray[np.float64]
    stderr: float
    strategy: str
    closed_at: float
    #: SHA-256 of the shard's manifest (:func:`stream_dp.compact.manifest_hash` of ``streams``)
    #: when the caller knows it; computed on demand otherwise
    manifest_sha256: str = ""

    def messages(self, settings: Settings, privacy: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        """``(key, value)`` of the ``dp.counts.v1`` messages, one per stream.

        Byte-identical to ``encode(count_message(...))`` (a unit test checks it) but built from
        a per-tick template: only the stream name and the value vary.
        """
        names = _json_names(self.streams)
        head = (
            f',"tick":{int(self.tick)},"tick_start":{float(self.tick_start)!r},'
            f'"tick_end":{float(self.tick_end)!r},"value":'
        )
        tail = (
            f',"stderr":{float(self.stderr)!r},"strategy":{json.dumps(self.strategy)},'
            f'"p":{float(settings.p)!r},"privacy":{encode(privacy).decode()},'
            f'"cap":{float(settings.cap)!r},"horizon":{int(settings.horizon)},'
            '"schema":"dp.counts.v1"}'
        )
        return [
            (key, f'{{"stream":{jname}{head}{v!r}{tail}'.encode())
            for (key, jname), v in zip(names, self.values.tolist(), strict=True)
        ]


    def shard_name(self) -> str:
        """The shard's name in compact records and manifests: ``shard-<index>``."""
        return f"shard-{int(self.shard)}"

    def manifest(self) -> bytes:
        """The shard's ``dp.manifest.v1`` value (docs/formats.md): its streams in bank order."""
        return encode_manifest(self.shard_name(), self.streams)

    def compact(self, settings: Settings, privacy: dict[str, Any]) -> bytes:
        """The whole tick as one ``dp.counts.block.v1`` record (docs/formats.md): the same
        values and fields as :meth:`messages` (a unit test decodes one into the other)."""
        return encode_block(
            shard=self.shard_name(), tick=int(self.tick), tick_start=float(self.tick_start),
            tick_end=float(self.tick_end), epoch=int(settings.epoch), strategy=self.strategy,
            p=float(settings.p), privacy=privacy, cap=float(settings.cap),
            horizon=int(settings.horizon),
            manifest=self.manifest_sha256 or manifest_hash(self.streams),
            values=self.values, stderr=np.full(len(self.streams), float(self.stderr)))


_NAME_CACHE: dict[tuple[str, ...], list[tuple[bytes, str]]] = {}


def _json_names(streams: tuple[str, ...]) -> list[tuple[bytes, str]]:
    """``(UTF-8 key, JSON string literal)`` per stream, cached per shard's stream tuple."""
    found = _NAME_CACHE.get(streams)
    if found is None:
        found = [(n.encode("utf-8"), json.dumps(n)) for n in streams]
        if len(_NAME_CACHE) > 64:
            _NAME_CACHE.clear()
        _NAME_CACHE[streams] = found
    return found


class ReleaseState:
    """Counter bank, next tick, pending partials and input offset of one release shard."""

    def __init__(
        self,
        settings: Settings,
        router: Router,
        shard: int,
        bank: Any,
        *,
        key: bytes | None = None,
        mechanism: Any = None,
    ) -> None:
        self.settings = settings
        self.router = router
        self.shard = shard
        self.bank = bank
        self._key = key
        self._mechanism = mechanism if mechanism is not None else (
            bank.mechanism if bank is not None else None
        )
        self._context: bytes | None = None
        self._domain_id: str | None = None
        self.names = tuple(router.shard_names(shard))
        self.sources = settings.events_partitions
        self.next_tick = 1
        self.offset = -1
        self.seq = 0
        #: tick -> source partition -> partial
        self.pending: dict[int, dict[int, Partial]] = {}
        #: (tick, source) -> piece -> the pieces read so far of a partial cut into several
        #: records (Partial.split); joined into :attr:`pending` once all have been read
        self.pieces: dict[tuple[int, int], dict[int, Partial]] = {}
        self.dirty = False
        self.duplicates = 0
        #: ticks below this were released (committed) before the state was restored: they are
        #: re-stepped silently from the retained partials and never published again
        self.resume_tick = 0
        #: ticks released since the newest full checkpoint (their state is in no checkpoint)
        self.unsaved = 0
        #: integer units of the partials (stream_dp.contributions) and the per-tick clip
        self.unit = value_unit(settings.cap)
        self.clip = clip_limit_units(settings.cap, settings.max_events_per_tick)
        #: (stream, tick)s whose count reached the clip (operator-only metric; never per stream)
        self.clipped = 0

    @property
    def checkpoint_every(self) -> int:
        """Full state with every K-th released tick (setting ``release_checkpoint_every``)."""
        return self.settings.release_checkpoint_every

    @property
    def restepping(self) -> bool:
        """True while ticks already released before a restore are being re-stepped."""
        return self.next_tick < self.resume_tick

    def add(self, offset: int, partial: Partial) -> None:
        """Record one partial read at ``offset`` of this shard's partials partition."""
        if offset < self.offset:
            return
        self.offset = offset + 1
        self.dirty = True
        if partial.shard != self.shard or not 0 <= partial.source < self.sources:
            raise ValueError(
                f"partial for shard {partial.shard} from source {partial.source} does not "
                f"belong to shard {self.shard} with {self.sources} sources"
            )
        if partial.tick < self.next_tick:
            self.duplicates += 1  # already released; committed partials are never resent
            return
        slot = self.pending.setdefault(partial.tick, {})
        if partial.source in slot:
            self.duplicates += 1
            return
        if partial.pieces != 1:
            got = self.pieces.setdefault((partial.tick, partial.source), {})
            if partial.piece in got:
                self.duplicates += 1
                return
            got[partial.piece] = partial
            if len(got) < partial.pieces:
                return
            del self.pieces[(partial.tick, partial.source)]
            partial = Partial.join(list(got.values()))
        slot[partial.source] = partial

    def ready(self) -> bool:
        """True if the next tick has partials from every events partition."""
        slot = self.pending.get(self.next_tick)
        return slot is not None and len(slot) == self.sources

    def gather(self, slot: dict[int, Partial]) -> NDArray[np.int64]:
        """One tick's count per stream of the shard (integer units) from its partials, one per
        source: added in source order, clipped to :attr:`clip` after every source (so every
        count stays < 2^53 and exact, whatever a partial holds)."""
        clip = self.clip
        units = np.zeros(len(self.names), dtype=np.int64)
        for src in range(self.sources):
            part = slot[src]
            if not len(part.idx):
                continue
            counts = part.counts
            if isinstance(counts, np.ndarray):
                # clipped first: units <= clip < 2^53, so the addition cannot wrap around
                # int64 even for a count near 2^63, and min(u + min(c, clip), clip) is
                # min(u + c, clip) for counts >= 0
                counts = np.minimum(counts, clip)
            else:  # Python ints, of any magnitude: clipped exactly before they meet int64
                counts = np.array([c if c < clip else clip for c in counts], dtype=np.int64)
            # indices are distinct (Partial.decode checks they increase): one add per stream
            units[np.asarray(part.idx, dtype=np.int64)] += counts
            np.minimum(units, clip, out=units)
        return units

    def step(self) -> Release:
        """Release the next tick (call only when :meth:`ready`)."""
        tick = self.next_tick
        slot = self.pending.pop(tick)
        clip = self.clip
        units = self.gather(slot)
        # Clip each stream's count to cap × max_events_per_tick (1-Lipschitz: the sensitivity
        # is unchanged) so that it never leaves the strategy's numeric range: a burst can
        # neither stop the releases nor change them except through the noisy value.
        self.clipped += int(np.count_nonzero(units == clip))
        counts = units.astype(np.float64) * self.unit  # exact: units < 2^53, unit = 2^k
        if self.bank is not None and self.bank.tick != tick - 1:
            raise RuntimeError(
                f"shard {self.shard}: bank is at tick {self.bank.tick}, expected {tick - 1}"
            )
        if self.bank is None:  # a shard without streams still keeps the schedule
            values = np.zeros(0, dtype=np.float64)
        else:
            try:
                values = np.asarray(self.bank.step(counts), dtype=np.float64)
            except ValueError as exc:
                self.pending[tick] = slot  # state unchanged
                raise ReleaseOverflow(
                    f"shard {self.shard}, tick {tick}: {exc}. The configuration lets counts "
                    "exceed the strategy's numeric range (docs/accuracy.md, 'Numeric range'); "
                    "lower max_events_per_tick × cap or choose another strategy/decay in a new "
                    "epoch"
                ) from None
        self.next_tick = tick + 1
        self.dirty = True
        start, end = self.settings.tick_bounds(tick)
        return Release(
            tick=tick,
            tick_start=start,
            tick_end=end,
            shard=self.shard,
            streams=self.names,
            values=values,
            stderr=float(self.bank.stderr) if self.bank is not None else 0.0,
            strategy=str(self.bank.mechanism.name) if self.bank is not None else "",
            closed_at=max(p.closed_at for p in slot.values()),
            manifest_sha256=self.bank.names_sha256() if self.bank is not None else "",
        )

    # ------------------------------------------------------------------ checkpoint
    def mechanism(self) -> Any:
        """The configured mechanism (from the bank, or built from the settings)."""
        if self._mechanism is None:
            self._mechanism = build_mechanism(self.settings)
        return self._mechanism

    @property
    def domain_id(self) -> str:
        """The deployment's identity (:func:`agents.config.deployment.deployment_id`: the domain
        digest and every setting that decides what a tick contains); binds noise and
        checkpoints to it."""
        if self._domain_id is None:
            from agents.config.deployment import deployment_id

            self._domain_id = deployment_id(self.settings, self.router.domain_id,
                                            getattr(self.router, "deployment_nonce", ""))
        return self._domain_id

    def context(self) -> bytes:
        """Canonical description of everything this shard's checkpoint is only valid under."""
        if self._context is None:
            s = self.settings
            self._context = canonical_json(
                {
                    "context": "stream-dp/release-checkpoint",
                    "version": 1,
                    "mechanism": self.mechanism().describe(),
                    "domain": self.domain_id,
                    "epoch": s.epoch,
                    "shard": self.shard,
                    "shards": s.shards,
                    "events_partitions": s.events_partitions,
                    "origin": s.origin,
                    "tick_seconds": s.tick_seconds,
                }
            )
        return self._context

    def to_bytes(self) -> bytes:
        """The shard's state, sealed (HMAC) under the noise key and bound to :meth:`context`."""
        if self._key is None:
            raise ValueError("ReleaseState needs the noise key (key=...) to seal checkpoints")
        header = json.dumps(
            {
                "v": 1,
                "shard": self.shard,
                "offset": self.offset,
                "next_tick": self.next_tick,
                "names": len(self.names),
                "pending": [
                    [p.tick, p.source, _int_list(p.idx), _int_list(p.counts), p.closed_at]
                    for slot in self.pending.values()
                    for p in slot.values()
                ],
                **self._pieces_header(),
            },
            separators=(",", ":"),
            allow_nan=False,
        ).encode()
        # names are the domain's: only their hash goes into each commit's checkpoint
        bank = self.bank.to_bytes(names=False) if self.bank is not None else b""
        body = _MAGIC + struct.pack(">Q", len(header)) + header + bank
        return seal(self._key, CHECKPOINT_PURPOSE, self.context(), body)

    def _pieces_header(self) -> dict[str, Any]:
        """The pieces read of partials not yet complete (only when there are some: a header
        without them is the one earlier versions wrote)."""
        if not self.pieces:
            return {}
        return {"pieces": [[p.tick, p.source, p.piece, p.pieces, _int_list(p.idx),
                            _int_list(p.counts), p.closed_at]
                           for got in self.pieces.values() for p in got.values()]}

    def progress_bytes(self) -> bytes:
        """A sealed progress record: the ticks before :attr:`next_tick` are released, on top
        of full checkpoint :attr:`seq` (written in the transactions between full checkpoints)."""
        if self._key is None:
            raise ValueError("ReleaseState needs the noise key (key=...) to seal checkpoints")
        body = canonical_json({"v": 1, "shard": self.shard, "base": self.seq,
                               "next_tick": self.next_tick})
        return seal(self._key, PROGRESS_PURPOSE, self.context(), body)

    def restore_progress(self, data: bytes, key: bytes) -> None:
        """After :meth:`restore`: apply the newest progress record built on that checkpoint,
        so ticks up to its ``next_tick`` are re-stepped silently (:attr:`restepping`)."""
        try:
            body = json.loads(unseal(key, PROGRESS_PURPOSE, self.context(), data))
        except (IntegrityError, ValueError) as exc:
            raise CheckpointRefused(
                f"release shard {self.shard}: refusing the progress record: {exc}") from None
        if body.get("v") != 1 or body.get("shard") != self.shard or body.get("base") != self.seq:
            raise CheckpointRefused(
                f"release shard {self.shard}: progress record of another version, shard or "
                "checkpoint")
        released = int(body["next_tick"])
        if released < self.next_tick:
            raise CheckpointRefused(
                f"release shard {self.shard}: progress record (next tick {released}) behind its "
                f"checkpoint (next tick {self.next_tick})")
        self.resume_tick = released
        self.unsaved = released - self.next_tick

    def restore(self, data: bytes, seq: int, key: bytes) -> None:
        """Restore from :meth:`to_bytes` output; :class:`CheckpointRefused` unless it was
        written under this key and exactly this configuration (nothing changed then)."""
        try:
            self._restore(data, seq, key)
        except IntegrityError as exc:
            raise CheckpointRefused(
                f"release shard {self.shard}: refusing the checkpoint: {exc}. A deployment's "
                "bound settings never change: start a new deployment (stream-dp deployment "
                "new; docs/operations.md, 'Changing the configuration')"
            ) from None

    def _restore_header(self, data: bytes, seq: int, key: bytes) -> bytes:
        """Verify the seal, restore offset, next tick and pending partials; return the body
        after the header (the counter state)."""
        data = unseal(key, CHECKPOINT_PURPOSE, self.context(), data)
        self._key = key
        if not data.startswith(_MAGIC):
            raise CheckpointRefused("release checkpoint: bad magic")
        (n,) = struct.unpack(">Q", data[len(_MAGIC) : len(_MAGIC) + 8])
        start = len(_MAGIC) + 8
        header = json.loads(data[start : start + n])
        if header.get("v") != 1 or header.get("shard") != self.shard:
            raise CheckpointRefused("release checkpoint of another version or shard")
        self.offset = int(header["offset"])
        self.next_tick = int(header["next_tick"])
        self.seq = seq
        self.pending = {}
        for tick, src, idx, counts, closed_at in header["pending"]:
            p = Partial(int(tick), int(src), self.shard, tuple(idx), tuple(counts), float(closed_at))
            self.pending.setdefault(p.tick, {})[p.source] = p
        self.pieces = {}
        for tick, src, piece, pieces, idx, counts, closed_at in header.get("pieces", []):
            p = Partial(int(tick), int(src), self.shard, tuple(idx), tuple(counts),
                        float(closed_at), int(piece), int(pieces))
            self.pieces.setdefault((p.tick, p.source), {})[p.piece] = p
        return data[start + n :]

    def _restore(self, data: bytes, seq: int, key: bytes) -> None:
        from stream_dp.counters import CounterBank

        body = self._restore_header(data, seq, key)
        if not self.names:
            self.bank = None
            return
        try:
            bank = CounterBank.from_bytes(
                body, key, mechanism=self.mechanism(), domain_id=self.domain_id,
                epoch=self.settings.epoch, stream_names=self.names,
            )
        except IntegrityError:
            raise
        except ValueError as exc:
            raise CheckpointRefused(f"shard {self.shard}: {exc}") from None
        if tuple(bank.names) != self.names:
            raise CheckpointRefused(
                f"shard {self.shard}: checkpoint streams differ from the domain's "
                "(the domain file or the shard count changed)"
            )
        self.bank = bank
        if bank.tick != self.next_tick - 1:
            raise CheckpointRefused(
                f"shard {self.shard}: checkpoint bank tick {bank.tick} != next_tick - 1"
            )
