"""The reconcile agent's scatter of compact records into domain order (``BlockAssembler``) takes
the known-stream positions from a per-manifest cache instead of masking each record: the
complete tick must be bit for bit the masked scatter's (the oracle below, written out here)."""

from __future__ import annotations

import numpy as np
import pytest

from agents.reconcile.tables import BlockAssembler
from stream_dp.compact import Manifest, decode_block, encode_block, manifest_hash


def _record(shard: str, streams: list[str], tick: int, values: np.ndarray,
            stderr: np.ndarray) -> bytes:
    return encode_block(shard=shard, tick=tick, tick_start=float(tick - 1), tick_end=float(tick),
                        epoch=0, strategy="tree", p=1.0, privacy={"model": "zcdp", "rho": 1.0},
                        cap=1.0, horizon=64, manifest=manifest_hash(streams), values=values,
                        stderr=stderr)


def _oracle(names: list[str], shards: list[tuple[list[str], np.ndarray, np.ndarray]]
            ) -> tuple[np.ndarray, np.ndarray]:
    """The scatter before the cache: a mask of known streams per record, shards in order."""
    index = {n: i for i, n in enumerate(names)}
    noisy, stderr = np.full(len(names), np.nan), np.full(len(names), np.nan)
    for streams, v, e in shards:
        pos = np.array([index.get(s, -1) for s in streams], dtype=np.int64)
        ok = pos >= 0
        noisy[pos[ok]] = v[ok]
        stderr[pos[ok]] = e[ok]
    return noisy, stderr


@pytest.mark.parametrize("unknown", [False, True])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_complete_tick_is_the_masked_scatter(unknown: bool, order: str) -> None:
    rng = np.random.default_rng(7 + unknown)
    names = [f"n{i}" for i in range(2_000)]
    perm = [names[i] for i in rng.permutation(len(names))]
    # three shards; with `unknown`, two of them also hold streams outside the domain
    split = [perm[:700], perm[700:1_500], perm[1_500:]]
    if unknown:
        split[0] = [*split[0][:300], "x-a", "x-b", *split[0][300:]]
        split[2] = ["x-c", *split[2]]
    # a domain node also written by a second shard: the later shard's value wins, as before
    split[1] = [*split[1], split[0][5]]
    manifests = {manifest_hash(s): Manifest(f"shard-{k}", tuple(s), manifest_hash(s))
                 for k, s in enumerate(split)}
    asm = BlockAssembler(names, shards=3)
    asm.set_manifests(manifests)
    assert asm.unknown_streams == (3 if unknown else 0)
    shards = []
    for streams in split:
        v = rng.normal(scale=50.0, size=len(streams))
        v[:3] = [-0.0, 5e-324, 1e300]
        shards.append((streams, v, np.abs(rng.normal(size=len(streams)))))
    feed = list(enumerate(shards)) if order == "forward" else list(enumerate(shards))[::-1]
    for k, (streams, v, e) in feed:
        asm.add_block(k, 10 + k, decode_block(_record(f"shard-{k}", streams, 4, v, e)))
    [tick] = asm.pop_complete()
    want_noisy, want_err = _oracle(names, [shards[k] for k, _ in feed])
    assert tick.tick == 4
    assert np.asarray(tick.noisy).tobytes() == want_noisy.tobytes()
    assert np.asarray(tick.stderr).tobytes() == want_err.tobytes()
