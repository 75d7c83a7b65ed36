"""Release-stage checkpoints are authenticated and bound to the whole configuration; counts
beyond a strategy's numeric range stop the release (refused at start-up when declared)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents.config.deployment import deployment_id
from agents.config.settings import Settings
from agents.ingest.routing import Partial, Router
from agents.kafka.checkpoints import CheckpointRefused
from agents.release.state import ReleaseState, build_mechanism
from agents.worker.pipeline import Worker
from stream_dp.counters import CounterBank
from stream_dp.domain import Domain
from stream_dp.strategies.fenwick.base import FenwickMechanism

KEY = b"0123456789abcdef0123456789abcdef"
DOMAIN = Domain.from_paths(["x/a", "x/b", "y/c"])


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


def settings(**kw: Any) -> Settings:
    base: dict[str, Any] = dict(origin=1000.0, tick_seconds=10.0, domain_file="unused.toml",
                                events_partitions=1, shards=1, epsilon=1.0, p=0.9,
                                strategy="dmfda", horizon=63)
    base.update(kw)
    return Settings(**base)


def shard(s: Settings, domain: Domain = DOMAIN, key: bytes = KEY, mechanism: Any = None
          ) -> ReleaseState:
    router = Router(domain, s.shards)
    mech = mechanism if mechanism is not None else build_mechanism(s)
    bank = CounterBank(mech, router.shard_names(0), key,
                       domain_id=deployment_id(s, domain.digest()), epoch=s.epoch)
    return ReleaseState(s, router, 0, bank, key=key, mechanism=mech)


def run_ticks(st: ReleaseState, counts: list[float], first: int = 1) -> None:
    for i, c in enumerate(counts):
        tick = first + i
        units = round(c / st.unit)  # partials carry integer units
        st.add(st.offset if st.offset >= 0 else 0,
               Partial(tick, 0, 0, tuple(range(len(st.names))), (units,) * len(st.names), 0.0))
        st.step()


def checkpoint(s: Settings) -> bytes:
    st = shard(s)
    run_ticks(st, [1.0, 2.0, 0.0])
    return st.to_bytes()


def test_same_configuration_restores_and_continues_bit_identically() -> None:
    s = settings()
    a = shard(s)
    run_ticks(a, [1.0, 2.0, 0.0])
    blob = a.to_bytes()
    b = ReleaseState(s, Router(DOMAIN, 1), 0, None)
    b.restore(blob, 1, KEY)
    assert b.next_tick == 4 and b.bank.tick == 3
    for st in (a, b):
        st.add(st.offset, Partial(4, 0, 0, (0,), (5.0,), 0.0))
    assert a.step().values.tobytes() == b.step().values.tobytes()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"epsilon": 1.5}, "epsilon"),
        ({"strategy": "dm"}, "strategy"),
        ({"p": 0.91}, "p"),
        ({"horizon": 127}, "horizon"),
        ({"cap": 2.0}, "cap"),
        ({"epoch": 1}, "epoch"),
        ({"privacy_model": "zcdp", "strategy": "tree"}, "strategy"),
    ],
)
def test_another_configuration_is_refused_naming_it(change: dict[str, Any], field: str) -> None:
    blob = checkpoint(settings())
    other = ReleaseState(settings(**change), Router(DOMAIN, 1), 0, None)
    with pytest.raises(CheckpointRefused, match="another configuration") as info:
        other.restore(blob, 1, KEY)
    assert field in str(info.value)
    assert "new deployment" in str(info.value)


def test_other_weights_domain_key_or_a_changed_byte_are_refused() -> None:
    s = settings(strategy="fenwick-opt")
    blob = checkpoint(s)
    mech = build_mechanism(s)

    class Bumped(type(mech)):  # type: ignore[misc]
        def _compute_weights(self, n: int) -> np.ndarray:
            w = np.array(super()._compute_weights(n))
            w[0] *= 1.1
            return w

    assert isinstance(mech, FenwickMechanism)
    bumped = Bumped(mech.p, mech.horizon, mech.privacy, mech.cap)
    router = Router(DOMAIN, 1)
    with pytest.raises(CheckpointRefused, match="weights"):
        ReleaseState(s, router, 0, None, mechanism=bumped).restore(blob, 1, KEY)
    other_domain = Domain.from_paths(["x/a", "x/b", "y/d"])
    with pytest.raises(CheckpointRefused, match="domain"):
        ReleaseState(s, Router(other_domain, 1), 0, None).restore(blob, 1, KEY)
    with pytest.raises(CheckpointRefused, match="failed authentication"):
        ReleaseState(s, router, 0, None).restore(blob, 1, bytes(32))
    for i in range(0, len(blob), max(1, len(blob) // 97)):
        bad = blob[:i] + bytes([blob[i] ^ 0x04]) + blob[i + 1 :]
        with pytest.raises(CheckpointRefused):
            ReleaseState(s, router, 0, None).restore(bad, 1, KEY)


@pytest.mark.parametrize("strategy", ["dmfda", "naive", "tree-ls"])
def test_a_progress_record_resteps_to_the_uninterrupted_state_bit_for_bit(strategy: str) -> None:
    """Full state at tick 3, progress record at tick 7: the restored shard re-steps ticks 4..7
    from the same partials and then releases ticks 8..10 bit-identical to a shard that never
    stopped (the noise is keyed by stream and tick, so a re-step draws it again exactly)."""
    s = settings(strategy=strategy, release_checkpoint_every=5)
    counts = [1.0, 2.0, 0.0, 7.5, 0.25, 3.0, 0.0, 11.0, 1.0, 4.0]
    a = shard(s)
    released = []
    for i, c in enumerate(counts):
        a.add(a.offset if a.offset >= 0 else 0,
              Partial(i + 1, 0, 0, tuple(range(len(a.names))), (c,) * len(a.names), 0.0))
        released.append(a.step().values.tobytes())
        if i + 1 == 3:
            a.seq = 4
            full, offset_after_3 = a.to_bytes(), a.offset
        if i + 1 == 7:
            progress = a.progress_bytes()
    b = ReleaseState(s, Router(DOMAIN, 1), 0, None, mechanism=build_mechanism(s))
    b.restore(full, 4, KEY)
    b.restore_progress(progress, KEY)
    assert (b.next_tick, b.resume_tick, b.unsaved, b.offset) == (4, 8, 4, offset_after_3)
    again = []
    for i in range(3, len(counts)):
        assert b.restepping == (i + 1 < 8)
        b.add(b.offset, Partial(i + 1, 0, 0, tuple(range(len(b.names))),
                                (counts[i],) * len(b.names), 0.0))
        again.append(b.step().values.tobytes())
    assert again == released[3:]
    assert not b.restepping


def test_progress_records_are_sealed_and_bound_to_their_checkpoint() -> None:
    s = settings(release_checkpoint_every=3)
    a = shard(s)
    run_ticks(a, [1.0, 2.0])
    a.seq = 2
    full = a.to_bytes()
    run_ticks(a, [3.0], first=3)
    progress = a.progress_bytes()

    def restored(seq: int = 2, s: Settings = s) -> ReleaseState:
        b = ReleaseState(s, Router(DOMAIN, 1), 0, None)
        b.restore(full, seq, KEY)
        return b

    b = restored()
    b.restore_progress(progress, KEY)
    assert (b.next_tick, b.resume_tick, b.unsaved) == (3, 4, 1)
    with pytest.raises(CheckpointRefused, match="another version, shard or checkpoint"):
        restored(seq=3).restore_progress(progress, KEY)  # built on another full checkpoint
    with pytest.raises(CheckpointRefused, match="progress record"):
        restored().restore_progress(progress, bytes(32))
    for i in range(0, len(progress), max(1, len(progress) // 61)):
        bad = progress[:i] + bytes([progress[i] ^ 0x01]) + progress[i + 1 :]
        with pytest.raises(CheckpointRefused):
            restored().restore_progress(bad, KEY)
    with pytest.raises(CheckpointRefused, match="another configuration"):
        restored(s=s.replace(epsilon=2.0))
    b = restored()
    b.next_tick = 9  # a progress record behind its checkpoint is refused
    with pytest.raises(CheckpointRefused, match="behind"):
        b.restore_progress(progress, KEY)
    with pytest.raises(ValueError, match="release_checkpoint_every"):
        settings(release_checkpoint_every=0)


def test_a_refused_checkpoint_stops_the_worker_instead_of_retrying() -> None:
    """_try_restore: CheckpointRefused is fatal (no retry loop), counted in a metric."""
    errors: list[str] = []

    class M:
        def release_error(self, reason: str) -> None:
            errors.append(reason)

        def __getattr__(self, name: str) -> Any:
            return lambda *a, **k: None

    w = Worker(settings(), key=KEY, domain=DOMAIN, metrics=M())  # type: ignore[arg-type]

    async def refuse(tp: Any) -> None:
        raise CheckpointRefused("release shard 0: refusing the checkpoint: tampered")

    w.release._restore = refuse  # type: ignore[method-assign]

    class TP:
        partition = 0

    asyncio.run(w.release._try_restore(TP()))
    assert isinstance(w.fatal, CheckpointRefused)
    assert errors == ["checkpoint_refused"]
    assert w.release._retry_at == 0.0  # no retry scheduled


def test_a_burst_beyond_max_events_per_tick_is_clipped_and_the_releases_go_on() -> None:
    """The halt of issue #11 and the overflow attack of issue #23: 60 000 events per tick at
    p = 0.999 used to stop every release for good at tick 1024. Now each stream's count is
    clipped to cap × max_events_per_tick: the releases go on, bit-identical to a run fed
    exactly the clip (the burst changes nothing but what the clip lets through), and the
    clipped stream-ticks are counted."""
    s = settings(p=0.999, horizon=4095, strategy="dmfda", tick_seconds=60.0,
                 max_events_per_tick=10_000)
    burst = shard(s, domain=Domain.flat(["busy"]))
    run_ticks(burst, [60_000.0] * 1100)
    at_clip = shard(s, domain=Domain.flat(["busy"]))
    run_ticks(at_clip, [10_000.0] * 1100)
    assert burst.bank.tick == at_clip.bank.tick == 1100
    assert np.array_equal(burst.bank.releases.view(np.int64),
                          at_clip.bank.releases.view(np.int64))
    assert burst.clipped == at_clip.clipped == 1100
    below = shard(s, domain=Domain.flat(["busy"]))
    run_ticks(below, [9_999.0] * 3)
    assert below.clipped == 0
    # dmfda (and so auto) covers the largest declarable rate at cap 1 (issues #23 and #26)
    for strategy in ("dmfda", "auto"):
        assert build_mechanism(s.replace(max_events_per_tick=2**29, strategy=strategy)
                               ).max_count() >= 2**29
    with pytest.raises(ValueError, match="max_events_per_tick"):
        s.replace(max_events_per_tick=2**29 + 1)


def test_worker_command_refuses_an_out_of_range_configuration_before_connecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit status 2 and one line naming the setting; the bootstrap is a closed port."""
    import argparse

    from agents.commands import worker

    domain = tmp_path / "d.toml"
    domain.write_text('kind = "flat"\nstreams = ["busy"]\n', encoding="utf-8")
    for k in [k for k in __import__("os").environ if k.startswith("STREAM_DP_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("STREAM_DP_ORIGIN", str(__import__("time").time()))
    monkeypatch.setenv("STREAM_DP_DOMAIN_FILE", str(domain))
    monkeypatch.setenv("STREAM_DP_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("STREAM_DP_STRATEGY", "blt")  # range 8.4·10^6 per tick at cap 1
    monkeypatch.setenv("STREAM_DP_PRIVACY_MODEL", "zcdp")
    monkeypatch.setenv("STREAM_DP_RHO", "0.5")
    monkeypatch.setenv("STREAM_DP_P", "0.999")
    monkeypatch.setenv("STREAM_DP_MAX_EVENTS_PER_TICK", "10000000")
    monkeypatch.setenv("STREAM_DP_KEY", KEY.hex())
    parser = argparse.ArgumentParser()
    worker.add_arguments(parser)
    rc = worker.run(parser.parse_args([]))
    err = capsys.readouterr().err
    assert rc == 2
    assert "max_events_per_tick" in err and "numeric range" in err
