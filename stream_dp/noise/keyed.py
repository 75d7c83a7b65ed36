"""``KeyedNoise``: secure, replayable noise for one bank of streams (implements ``BoundNoise``).

One sample per stream per call, in grid units, from the exact samplers of
:mod:`stream_dp.noise.laplace` and :mod:`stream_dp.noise.gaussian`, driven by the AES PRF of
:mod:`stream_dp.noise.prf` under ``(secret, tag)``.

Determinism and independence. The sample of a stream for ``node`` is a function of
``(secret, tag, distribution, parameter, stream id, node)`` only: the rejection loop of each
stream reads the blocks ``(stream id, node, 0), (stream id, node, 1), …`` of its own (one draw
counter per stream) under the PRF of ``tag | distribution/parameter`` (the parameter as its exact
``float.hex``), plus, in the rare exact paths, refinement blocks of independent child PRFs.

Why the parameter is part of the key: the samplers are deterministic functions of the bits, so
the same bits at two scales would give strongly *coupled* noise (``Z' ≈ Z·b'/b``), and two
releases of the same data at two budgets could then be combined to cancel the noise. With the
parameter in the key, a release at another ε or ρ gets independent noise and the budgets simply
add. The Laplace and Gaussian samples of one node are independent for the same reason.
Hence the same key replays the same noise (a replayed tick is bit-identical, DESIGN.md §2.5), and
the noise of a stream does not depend on which other streams share the bank, their order, or
how the streams are partitioned across workers.

Callers must never reuse ``node`` for two different random quantities of one stream under the same
tag (the mechanisms encode tick and tree level into ``node``).

Draw counters are 16 bits: a stream may use at most 2^16 blocks per ``(node, call)``. The
expected number is below 2 (Laplace) or 4 (Gaussian) and each attempt succeeds with
probability > 0.3, so exhaustion has probability below 0.7^65536 ≈ 10^-10000; it raises
:class:`NoiseExhaustedError` rather than reusing bits.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from numpy.typing import ArrayLike, NDArray

from stream_dp.noise.gaussian import sample_discrete_gaussian, validate_sigma
from stream_dp.noise.keys import SecretKey
from stream_dp.noise.laplace import discrete_laplace_params, sample_discrete_laplace
from stream_dp.noise.prf import MAX_DRAWS, MAX_NODE, BlockPRF

__all__ = [
    "NOISE_FORMAT","KeyedNoise", "NoiseExhaustedError"]


class NoiseExhaustedError(RuntimeError):
    """A stream used up its 2^16 draws for one sample (never expected to happen)."""


def _as_stream_ids(stream_ids: ArrayLike) -> NDArray[np.uint64]:
    arr = np.asarray(stream_ids)
    if arr.ndim != 1:
        raise ValueError(f"stream_ids must be a 1-D array of uint64 ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if arr.dtype == np.uint64:
        return arr.copy()
    if arr.dtype.kind == "i" and int(arr.min()) >= 0:
        return arr.astype(np.uint64)
    if arr.dtype == object and all(isinstance(x, int) and 0 <= x < 2**64 for x in arr.tolist()):
        return np.array(arr.tolist(), dtype=np.uint64)
    raise ValueError("stream_ids must be integers in [0, 2**64) (see stream_dp.noise.stream_id)")


def _validate_node(node: int) -> int:
    if isinstance(node, bool) or not isinstance(node, (int, np.integer)):
        raise ValueError(f"node must be an integer in [0, 2**48), got {node!r}")
    if not 0 <= int(node) < MAX_NODE:
        raise ValueError(f"node must be an integer in [0, 2**48), got {node!r}")
    return int(node)


class _Channel:
    """The PRF of one ``(tag, distribution, parameter)`` and its refinement PRFs."""

    __slots__ = ("_refine", "prf")

    def __init__(self, prf: BlockPRF) -> None:
        self.prf = prf
        self._refine: dict[tuple[int, int], BlockPRF] = {}

    def refinement_prf(self, channel: int, round_: int) -> BlockPRF:
        k = (channel, round_)
        prf = self._refine.get(k)
        if prf is None:
            prf = self.prf.child(f"refine/{channel}/{round_}")
            self._refine[k] = prf
        return prf


class _Source:
    """Blocks of one ``(key, tag, distribution, parameter, node)``; a ``_exact.DrawSource``."""

    __slots__ = ("_channel", "_node")

    def __init__(self, channel: _Channel, node: int) -> None:
        self._channel = channel
        self._node = node

    def draw(
        self,
        ids: NDArray[np.uint64],
        counters: NDArray[np.uint64],
        out: NDArray[np.uint64] | None = None,
    ) -> NDArray[np.uint64]:
        try:  # the PRF checks the counters (in the same pass as it builds its input)
            return self._channel.prf.blocks(ids, self._node, counters, out)
        except ValueError:
            if counters.size and int(counters.max()) >= MAX_DRAWS:
                raise NoiseExhaustedError(
                    f"a stream exhausted its {MAX_DRAWS} pseudo-random draws for node "
                    f"{self._node}"
                ) from None
            raise

    def refine(self, stream_id: int, counter: int, channel: int, round_: int) -> int:
        if round_ >= MAX_DRAWS:  # pragma: no cover - probability ≈ 2^(-12·65536)
            raise NoiseExhaustedError("exact comparison did not settle")
        prf = self._channel.refinement_prf(channel, round_)
        return prf.block_int(stream_id, self._node, counter)


_MAX_CHANNELS = 256


#: Version of the noise stream (key derivation, PRF block layout, sampler algorithms). Any change
#: that alters a single sample for the same key must bump it: checkpoints record it, and a bank
#: refuses to resume from a checkpoint drawn with another format, since its re-released ticks
#: would no longer be bit-identical.
NOISE_FORMAT = "aes256-hkdf-sha256/cks2020-split8/2"


class KeyedNoise:
    """Exact discrete noise keyed by ``(secret, tag, stream id, node)``; one sample per stream.

    ``key``: the secret (bytes ≥ 32 or :class:`SecretKey`); ``tag``: domain separation (the
    mechanism's ``tag``); ``stream_ids``: uint64 ids (:func:`stream_dp.noise.stream_ids`).
    """

    def __init__(self, key: bytes | SecretKey, tag: str, stream_ids: ArrayLike) -> None:
        if not isinstance(tag, str):
            raise ValueError(f"tag must be a str, got {type(tag).__name__}")
        self._key = SecretKey(key)
        self.tag = tag
        self.stream_ids = _as_stream_ids(stream_ids)
        self.prf = BlockPRF(self._key, tag)
        self._channels: OrderedDict[str, _Channel] = OrderedDict()

    def __repr__(self) -> str:
        return f"KeyedNoise(tag={self.tag!r}, streams={self.stream_ids.shape[0]}, key=<hidden>)"

    def __len__(self) -> int:
        return int(self.stream_ids.shape[0])

    def _source(self, kind: str, param: float, node: int) -> _Source:
        """Source for one distribution and exact parameter (cached, at most 256 channels)."""
        label = f"{kind}/{float(param).hex()}"
        channel = self._channels.get(label)
        if channel is None:
            channel = _Channel(self.prf.child(label))
            self._channels[label] = channel
            if len(self._channels) > _MAX_CHANNELS:
                self._channels.popitem(last=False)
        else:
            self._channels.move_to_end(label)
        return _Source(channel, _validate_node(node))

    def with_streams(self, stream_ids: ArrayLike) -> KeyedNoise:
        """Same key and tag, other streams (the noise of a shared stream is unchanged)."""
        return KeyedNoise(self._key, self.tag, stream_ids)

    def discrete_laplace(self, node: int, scale: float) -> NDArray[np.int64]:
        """Exact discrete Laplace, ``P(k) ∝ exp(−|k|/scale)``, ``scale`` in grid units
        (``[2**-8, 2**50]``); one int64 per stream."""
        discrete_laplace_params(scale)  # validate before deriving a key
        return sample_discrete_laplace(self._source("laplace", scale, node), self.stream_ids, scale)

    def discrete_gaussian(self, node: int, sigma: float) -> NDArray[np.int64]:
        """Exact discrete Gaussian, ``P(k) ∝ exp(−k²/(2σ²))``, ``sigma`` in grid units
        (``[2**-8, 2**46]``); one int64 per stream."""
        validate_sigma(sigma)
        return sample_discrete_gaussian(
            self._source("gaussian", sigma, node), self.stream_ids, sigma
        )
