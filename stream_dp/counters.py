"""Decayed DP counters: :class:`CounterBank` (S streams as NumPy arrays) and :class:`DecayedCounter`.

A bank holds one mechanism (strategy, decay ``p``, horizon, budget, cap) and the state of S
declared streams; :meth:`CounterBank.step` takes one tick's per-stream counts and returns the
release of every stream — a few vector operations, no Python loop over streams. Every stream
releases at every tick (zeros included): the schedule never depends on the data.

Noise is keyed by ``(secret, bank context, stream id, node)`` (:class:`stream_dp.noise.KeyedNoise`)
where the *bank context* (:func:`bank_context`) is the canonical, versioned description of the
whole mechanism (:meth:`stream_dp.mechanism.Mechanism.describe`: strategy, exact budget, grid,
decay, horizon, weights, …) plus the deployment's ``domain_id`` and ``epoch``, hashed with SHA-256
into the HKDF label of the noise key. Two banks that differ in any of these draw unrelated noise
under one secret; the stream name keys each stream within a bank.

Restoring a checkpoint (:meth:`CounterBank.to_bytes` / :meth:`CounterBank.from_bytes`) and
replaying the same counts reproduces bit-identical releases. Checkpoints are sealed
(:mod:`stream_dp.integrity`: HMAC-SHA256 under a key derived from the secret, bound to the bank
context), so a changed byte, another key or another configuration is refused with
:class:`~stream_dp.integrity.IntegrityError`. The key is never serialised.

Units: counts are per tick and per stream, each event already clamped to ``cap``; ``epsilon`` is
per event, per stream.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from stream_dp.budget import Privacy, PureDP, privacy_from_dict
from stream_dp.integrity import IntegrityError, seal, unseal
from stream_dp.mechanism import (
    DESCRIPTION_VERSION,
    BoundNoise,
    Float64Array,
    Mechanism,
    State,
    canonical_json,
)
from stream_dp.noise.keyed import NOISE_FORMAT

__all__ = ["CHECKPOINT_PURPOSE", "DEFAULT_HORIZON", "CounterBank", "DecayedCounter",
           "bank_context"]

#: Horizon (ticks per epoch) used by :class:`DecayedCounter` when none is given.
DEFAULT_HORIZON = 2**16 - 1

#: :func:`stream_dp.integrity.seal` purpose of :meth:`CounterBank.to_bytes`.
CHECKPOINT_PURPOSE = "counter-bank checkpoint"

_MAGIC = b"SDPBANK2"
_MAX_EPOCH = 2**63 - 1


def _check_domain_id(domain_id: object) -> str:
    if not isinstance(domain_id, str):
        raise ValueError(f"domain_id must be a str (e.g. Domain.digest()), got {domain_id!r}")
    try:
        domain_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("domain_id must be valid Unicode text (no lone surrogates)") from None
    return domain_id


def _check_epoch(epoch: object) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
        raise ValueError(f"epoch must be an integer in [0, 2**63), got {epoch!r}")
    e = int(epoch)
    if not 0 <= e <= _MAX_EPOCH:
        raise ValueError(f"epoch must be an integer in [0, 2**63), got {epoch!r}")
    return e


def bank_context(mechanism: Mechanism, domain_id: str = "", epoch: int = 0) -> bytes:
    """Canonical bytes naming everything a bank's noise and checkpoints depend on.

    The mechanism's full description (:meth:`Mechanism.describe`), the noise format, the
    description version, the deployment's ``domain_id`` (e.g. :meth:`Domain.digest`) and
    ``epoch`` (a new epoch = fresh noise and its own budget). SHA-256 of it keys the noise;
    it is the MAC context of :meth:`CounterBank.to_bytes`.
    """
    return canonical_json(
        {
            "context": "stream-dp/counter-bank",
            "description_version": DESCRIPTION_VERSION,
            "noise_format": NOISE_FORMAT,
            "mechanism": mechanism.describe(),
            "domain": _check_domain_id(domain_id),
            "epoch": _check_epoch(epoch),
        }
    )


def _check_key(key: object) -> bytes:
    from stream_dp.noise.keys import MIN_KEY_BYTES, SecretKey

    if isinstance(key, SecretKey):
        return key.reveal()
    if not isinstance(key, (bytes, bytearray)) or len(key) < MIN_KEY_BYTES:
        kind = (
            type(key).__name__ if not isinstance(key, (bytes, bytearray)) else f"{len(key)} bytes"
        )
        raise ValueError(
            f"key must be bytes of length ≥ {MIN_KEY_BYTES} (the noise secret, see "
            f"stream_dp.noise.load_key), got {kind}"
        )
    return bytes(key)


def _check_names(stream_names: Sequence[str]) -> tuple[str, ...]:
    if isinstance(stream_names, str) or not isinstance(stream_names, Sequence):
        raise ValueError("stream_names must be a sequence of distinct non-empty strings")
    names = tuple(stream_names)
    if any(not isinstance(n, str) or not n for n in names):
        raise ValueError("stream_names must be a sequence of distinct non-empty strings")
    if len(set(names)) != len(names):
        raise ValueError("stream_names must be distinct (duplicates given)")
    return names


def _make_noise(key: bytes, tag: str, names: tuple[str, ...]) -> BoundNoise:
    from stream_dp.noise.keyed import KeyedNoise
    from stream_dp.noise.keys import stream_ids

    noise: BoundNoise = KeyedNoise(key, tag, stream_ids(names))
    return noise


class CounterBank:
    """The state of S streams under one mechanism; one :meth:`step` per tick.

    ``domain_id`` names the deployment's declared domain (the service passes
    :meth:`stream_dp.domain.Domain.digest`) and ``epoch`` its configuration epoch; both are
    part of the noise key and of the checkpoint context (see the module docstring).

    >>> from stream_dp.planner import make_mechanism
    >>> bank = CounterBank(make_mechanism("dmfda", 0.9, 63, PureDP(1.0)), ["a", "b"], b"k" * 32)
    >>> bank.step([3, 0]).shape, bank.tick
    ((2,), 1)
    """

    def __init__(
        self,
        mechanism: Mechanism,
        stream_names: Sequence[str],
        key: bytes,
        *,
        domain_id: str = "",
        epoch: int = 0,
    ) -> None:
        if not isinstance(mechanism, Mechanism):
            raise ValueError(
                f"mechanism must be a stream_dp Mechanism, got {type(mechanism).__name__}"
            )
        self._names = _check_names(stream_names)
        # Fail fast on a budget the samplers refuse (e.g. an enormous ε), before any tick.
        mechanism.variance(1)
        self._mechanism = mechanism
        self._domain_id = _check_domain_id(domain_id)
        self._epoch = _check_epoch(epoch)
        self._context = bank_context(mechanism, self._domain_id, self._epoch)
        secret = _check_key(key)
        from stream_dp.noise.keys import SecretKey

        self._secret = SecretKey(secret)
        tag = "stream-dp/bank/v1/" + hashlib.sha256(self._context).hexdigest()
        self._noise = _make_noise(secret, tag, self._names)
        self._state: State = mechanism.new_state(len(self._names))

    # ------------------------------------------------------------------ properties
    @property
    def mechanism(self) -> Mechanism:
        """The configured mechanism (strategy, p, horizon, privacy, cap)."""
        return self._mechanism

    @property
    def domain_id(self) -> str:
        """The domain identity this bank's noise and checkpoints are bound to."""
        return self._domain_id

    @property
    def epoch(self) -> int:
        """The configuration epoch this bank's noise and checkpoints are bound to."""
        return self._epoch

    @property
    def context(self) -> bytes:
        """:func:`bank_context` of this bank (canonical JSON; no secret in it)."""
        return self._context

    @property
    def names(self) -> tuple[str, ...]:
        """Stream names, in the order of the count and release arrays."""
        return self._names

    @property
    def n_streams(self) -> int:
        """Number of streams S."""
        return len(self._names)

    @property
    def tick(self) -> int:
        """Number of ticks released so far (the last release is for this tick; 0 = none)."""
        return int(self._state["tick"])

    @property
    def releases(self) -> Float64Array:
        """A copy of the last release of every stream (zeros before the first tick)."""
        rel = self._state.get("release")
        if rel is None:  # pragma: no cover - every built-in mechanism keeps its release
            return np.zeros(self.n_streams, dtype=np.float64)
        return np.array(rel, dtype=np.float64, copy=True)

    @property
    def stderr(self) -> float:
        """Analytic standard error of the last release (same for every stream; NaN before tick 1).

        The root of the noise variance plus the squared bound on the grid-rounding bias
        (:func:`stream_dp.analysis.with_rounding`: left out when negligible), so it also covers a
        budget so large that the rounding, not the noise, is the error.
        """
        t = self.tick
        if t == 0:
            return math.nan
        from stream_dp.figures import with_rounding

        return math.sqrt(with_rounding(self._mechanism.variance(t), self._rounding_bias(t)))

    def _rounding_bias(self, t: int) -> float:
        from stream_dp.figures import rounding_bias

        # the bound is constant for p < 1 and grows with the ticks for p = 1: evaluate it at
        # the horizon, then at doublings of it (an upper bound for every tick up to there)
        ticks = max(1, self._mechanism.horizon)
        while ticks < t:
            ticks *= 2
        cache: dict[int, float] = self.__dict__.setdefault("_bias_cache", {})
        if ticks not in cache:
            cache[ticks] = rounding_bias(self._mechanism, ticks)
        return cache[ticks]

    # ------------------------------------------------------------------ stepping
    def step(self, counts: ArrayLike) -> Float64Array:
        """Advance all streams by one tick; ``counts``: shape (S,), finite, ≥ 0 (per-tick sums).

        Raises ``ValueError`` (state unchanged) for a wrong shape, NaN/inf or negative counts, or
        counts beyond the mechanism's numeric range.
        """
        arr = np.asarray(counts, dtype=np.float64)
        if arr.shape != (self.n_streams,):
            raise ValueError(
                f"counts must have shape ({self.n_streams},) (one count per stream), got {arr.shape}"
            )
        if arr.size:
            # two reductions, no temporaries: min ≥ 0 fails for NaN and negatives, the sum of
            # non-negative numbers is finite unless one is inf (or all overflow)
            low = float(arr.min())
            if not math.isfinite(float(arr.sum())) or not math.isfinite(low):
                raise ValueError("counts must be finite numbers ≥ 0 (NaN or inf given)")
            if low < 0.0:
                raise ValueError("counts must be finite numbers ≥ 0 (a negative count given)")
        return self._mechanism.step(self._state, arr, self._noise)

    # ------------------------------------------------------------------ serialisation
    def _config(self) -> dict[str, Any]:
        m = self._mechanism
        privacy = getattr(m, "privacy", None)
        if privacy is None:  # pragma: no cover - every registered mechanism carries its budget
            raise ValueError("mechanism has no privacy attribute; cannot serialise")
        return {
            "strategy": m.name,
            "p": m.p,
            "horizon": m.horizon,
            "cap": m.cap,
            "privacy": privacy.as_dict(),
        }

    def names_sha256(self) -> str:
        """Hex SHA-256 of the stream names in order (:func:`stream_dp.compact.manifest_hash`),
        computed once."""
        found = self.__dict__.get("_names_sha256")
        if found is None:
            from stream_dp.compact import manifest_hash

            found = self.__dict__["_names_sha256"] = manifest_hash(self._names)
        return str(found)

    def to_bytes(self, names: bool = True) -> bytes:
        """Mechanism config, stream names and state as bytes (never the key), sealed with an
        HMAC-SHA256 under a key derived from the noise secret and bound to :attr:`context`.

        ``names=False`` stores only the names' SHA-256 (:meth:`names_sha256`): for callers that
        know the names (a service shard: its domain), so a checkpoint of 10^6 streams does not
        repeat megabytes of names at every commit; :meth:`from_bytes` then needs them."""
        arrays = []
        blobs = []
        for name in sorted(self._state):
            a = np.asarray(self._state[name])
            le = a.astype(a.dtype.newbyteorder("<"), copy=False)
            arrays.append({"name": name, "dtype": le.dtype.str, "shape": list(a.shape)})
            blobs.append(le.tobytes())
        header = json.dumps(
            {
                "version": 2,
                "noise_format": NOISE_FORMAT,
                "mechanism": self._config(),
                "domain": self._domain_id,
                "epoch": self._epoch,
                **({"streams": list(self._names)} if names else
                   {"streams_sha256": self.names_sha256(), "n_streams": len(self._names)}),
                "arrays": arrays,
            },
            ensure_ascii=False,
            allow_nan=False,
        ).encode("utf-8")
        body = _MAGIC + struct.pack("<Q", len(header)) + header + b"".join(blobs)
        return seal(self._secret.reveal(), CHECKPOINT_PURPOSE, self._context, body)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        key: bytes,
        *,
        mechanism: Mechanism | None = None,
        domain_id: str | None = None,
        epoch: int | None = None,
        stream_names: Sequence[str] | None = None,
    ) -> CounterBank:
        """Restore a bank written by :meth:`to_bytes`; ``key`` is the same noise secret.

        ``stream_names``: required for a checkpoint written with ``names=False`` (their SHA-256
        must match the stored one), ignored otherwise.

        With ``mechanism`` (and ``domain_id``/``epoch``, default ``""``/``0``) the checkpoint
        must have been written under exactly that configuration; without it the configuration
        stored in the (authenticated) checkpoint is rebuilt and must describe itself the same
        way. Raises :class:`~stream_dp.integrity.IntegrityError` (a ``ValueError``) for a
        changed byte, another key or another configuration, ``ValueError`` for other damage.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError("data must be bytes written by CounterBank.to_bytes")
        raw = bytes(data)
        secret = _check_key(key)
        if mechanism is not None:
            expected = bank_context(
                mechanism,
                "" if domain_id is None else domain_id,
                0 if epoch is None else epoch,
            )
            body = unseal(secret, CHECKPOINT_PURPOSE, expected, raw)
        else:
            stored = _stored_context(raw)
            body = unseal(secret, CHECKPOINT_PURPOSE, stored, raw)
        if len(body) < len(_MAGIC) + 8 or not body.startswith(_MAGIC):
            raise ValueError("data is not a CounterBank checkpoint (bad magic or too short)")
        (hlen,) = struct.unpack_from("<Q", body, len(_MAGIC))
        start = len(_MAGIC) + 8
        try:
            header = json.loads(body[start : start + hlen].decode("utf-8"))
            if header.get("version") != 2:
                raise ValueError(
                    f"unsupported CounterBank checkpoint version {header.get('version')!r}"
                )
            if header.get("noise_format") != NOISE_FORMAT:
                raise ValueError(
                    f"checkpoint noise format {header.get('noise_format')!r} differs from this "
                    f"library's {NOISE_FORMAT!r}: resumed ticks would not reproduce earlier "
                    "releases bit for bit; restore it with the library version that wrote it"
                )
            if mechanism is None:
                from stream_dp.planner import make_mechanism

                cfg = header["mechanism"]
                privacy = privacy_from_dict(cfg["privacy"])
                mech = make_mechanism(
                    cfg["strategy"], cfg["p"], cfg["horizon"], privacy, cfg["cap"]
                )
                rebuilt = bank_context(mech, header["domain"], header["epoch"])
                if rebuilt != stored:
                    # e.g. a tree plan re-derived differently by another library version:
                    # resuming would key the noise differently and re-release other values.
                    raise IntegrityError(
                        "counter-bank checkpoint describes a mechanism that this library "
                        "version rebuilds differently; restore it with the library version "
                        "that wrote it",
                        "configuration",
                    )
                dom, ep = str(header["domain"]), int(header["epoch"])
            else:
                mech = mechanism
                dom = "" if domain_id is None else domain_id
                ep = 0 if epoch is None else epoch
            if "streams" in header:
                streams = header["streams"]
            else:
                if stream_names is None:
                    raise ValueError("this checkpoint stores only the hash of its stream names: "
                                     "pass stream_names")
                from stream_dp.compact import manifest_hash

                streams = list(stream_names)
                if len(streams) != int(header["n_streams"]) or manifest_hash(
                        streams) != header["streams_sha256"]:
                    raise ValueError("the given stream names are not the checkpoint's (their "
                                     "SHA-256 differs)")
            specs = header["arrays"]
        except (
            KeyError,
            TypeError,
            AttributeError,
            UnicodeDecodeError,
            json.JSONDecodeError,
        ) as exc:
            raise ValueError(f"data is not a valid CounterBank checkpoint header: {exc}") from exc
        bank = cls(mech, streams, secret, domain_id=dom, epoch=ep)
        offset = start + hlen
        state: State = {}
        for spec in specs:
            dtype = np.dtype(spec["dtype"])
            shape = tuple(int(x) for x in spec["shape"])
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if offset + size > len(body):
                raise ValueError("data is truncated: CounterBank checkpoint arrays incomplete")
            arr = np.frombuffer(body, dtype=dtype, count=size // dtype.itemsize, offset=offset)
            state[spec["name"]] = arr.reshape(shape).astype(dtype.newbyteorder("="), copy=True)
            offset += size
        if offset != len(body):
            raise ValueError("data is corrupt: trailing bytes after the CounterBank arrays")
        fresh = bank._state
        if set(state) != set(fresh):
            raise ValueError(f"checkpoint arrays {sorted(state)} do not match {sorted(fresh)}")
        for name, arr in state.items():
            if arr.ndim != fresh[name].ndim or (arr.ndim and arr.shape[-1] != bank.n_streams):
                raise ValueError(
                    f"checkpoint array {name!r} has shape {arr.shape}, wrong for the bank"
                )
        bank._state = state
        return bank


def _stored_context(raw: bytes) -> bytes:
    """The context stored in a sealed blob (unauthenticated: only to verify the MAC with)."""
    head = b"SDPSEAL1"
    if len(raw) < len(head) + 8 or not raw.startswith(head):
        raise IntegrityError(
            "counter-bank checkpoint: not a sealed blob (bad magic or too short; checkpoints "
            "of library versions before the sealed format cannot be restored)",
            "malformed",
        )
    (n,) = struct.unpack_from(">Q", raw, len(head))
    if n > len(raw):
        raise IntegrityError("counter-bank checkpoint: sealed blob truncated", "malformed")
    return raw[len(head) + 8 : len(head) + 8 + n]


class DecayedCounter:
    """One stream's DP decayed count: ``update(count)`` returns the release for that tick.

    ``p`` ∈ (0, 1] decay per tick; ``epsilon`` per event (pure DP) — or ``rho`` per event
    (ρ-zCDP) instead; ``strategy`` a registered name or ``"auto"``; ``horizon`` ticks per epoch;
    ``key`` the noise secret (bytes, ≥ 32); ``cap`` bounds one event's contribution; ``name`` the
    stream name, **required**: it keys the counter's noise, so two counters under one key must
    have different names (otherwise they would share their noise); ``integer_counts=True``
    declares whole-number counts, which lets ``auto`` use the integer-grid strategies
    (``naive-int``); ``domain_id``/``epoch`` as for :class:`CounterBank`.

    >>> c = DecayedCounter(p=0.9, epsilon=1.0, strategy="naive", key=b"k" * 32, name="visits")
    >>> isinstance(c.update(2), float), c.tick
    (True, 1)
    >>> DecayedCounter(p=0.99, rho=0.5, key=b"k" * 32, name="sales").strategy
    'blt'
    """

    def __init__(
        self,
        p: float,
        epsilon: float | None = None,
        strategy: str = "auto",
        horizon: int = DEFAULT_HORIZON,
        key: bytes | None = None,
        cap: float = 1.0,
        name: str | None = None,
        *,
        rho: float | None = None,
        integer_counts: bool = False,
        domain_id: str = "",
        epoch: int = 0,
    ) -> None:
        from stream_dp.budget import ZCDP
        from stream_dp.planner import make_mechanism

        key_bytes = _check_key(key)
        if not isinstance(name, str) or not name:
            raise ValueError(
                "name must be a non-empty string naming the counter: it keys the counter's "
                "noise, so two counters under one key must have different names"
            )
        if (epsilon is None) == (rho is None):
            raise ValueError(
                "give exactly one budget: epsilon (pure ε-DP, > 0) or rho (ρ-zCDP, > 0), "
                f"got epsilon={epsilon!r}, rho={rho!r}"
            )
        privacy: Privacy = PureDP(epsilon) if epsilon is not None else ZCDP(float(rho or 0.0))
        mech = make_mechanism(strategy, p, horizon, privacy, cap, integer_counts=integer_counts)
        self._bank = CounterBank(mech, [name], key_bytes, domain_id=domain_id, epoch=epoch)

    @property
    def bank(self) -> CounterBank:
        """The one-stream bank underneath."""
        return self._bank

    @property
    def strategy(self) -> str:
        """The resolved strategy name (never ``"auto"``)."""
        return self._bank.mechanism.name

    @property
    def tick(self) -> int:
        """Ticks released so far."""
        return self._bank.tick

    @property
    def stderr(self) -> float:
        """Analytic standard error of the last release."""
        return self._bank.stderr

    def update(self, count: float) -> float:
        """Add one tick with ``count`` (finite, ≥ 0) and return that tick's release."""
        if isinstance(count, bool) or not isinstance(count, (int, float, np.integer, np.floating)):
            raise ValueError(f"count must be a finite number ≥ 0, got {count!r}")
        return float(self._bank.step(np.array([float(count)]))[0])

    def to_bytes(self) -> bytes:
        """Checkpoint (no key)."""
        return self._bank.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes, key: bytes) -> DecayedCounter:
        """Restore a counter written by :meth:`to_bytes`."""
        bank = CounterBank.from_bytes(data, key)
        if bank.n_streams != 1:
            raise ValueError("data holds a bank of several streams, not a DecayedCounter")
        obj = cls.__new__(cls)
        obj._bank = bank
        return obj
