"""A deployment's workers step the same ``blt`` filter on any CPU: the fits the first worker used
travel in the deployment's nonce record and every worker pins them before it builds state.

A fit the package does not ship is made on the host by an optimiser whose path goes through the
host's BLAS; forcing OpenBLAS's kernels (``OPENBLAS_CORETYPE``) moved ``blt``'s fit at
p = 0.999, horizon 4095 to another optimum, and with it the mechanism's description, the noise
key and the checkpoint seal (docs/operations.md). Here the pinning itself, with a fit that
differs the way another host's does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.config.settings import Settings
from agents.kafka.nonce import nonce_record, parse_nonce, parse_nonce_record
from stream_dp.budget import ZCDP
from stream_dp.mechanism import canonical_json
from stream_dp.planner import make_mechanism
from stream_dp.strategies.blt import plan

KEY = bytes(range(100, 132))
DIGEST = "d" * 64
P, T = 0.95, 255


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A private fit cache, and the process's pinned and used fits as they were before."""
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))
    pinned, used = dict(plan._PINNED), dict(plan._USED)
    plan.fit.cache_clear()
    yield
    plan._PINNED.clear()
    plan._PINNED.update(pinned)
    plan._USED.clear()
    plan._USED.update(used)
    plan.fit.cache_clear()


def _other_host(fit: dict[str, Any]) -> dict[str, Any]:
    """The same fit a few parts in 10⁵ off, as another host's optimiser ends (still stable)."""
    return {**fit, "theta": [t * (1.0 - 1e-5) for t in fit["theta"]],
            "w": [v * (1.0 - 1e-4) for v in fit["w"]]}


def test_the_fits_used_are_listed_and_pinned_ones_win() -> None:
    before = make_mechanism("blt", P, T, ZCDP(0.5))
    used = [f for f in plan.fits_used() if (f["p"], f["n"]) == (P, T)]
    assert len(used) == 1 and tuple(used[0]["theta"]) == tuple(before.theta.tolist())
    other = _other_host(used[0])
    assert plan.pin_fits([other]) is True  # differs from the fit this process used
    after = make_mechanism("blt", P, T, ZCDP(0.5))
    assert tuple(after.theta.tolist()) == tuple(other["theta"])
    assert tuple(after.w.tolist()) == tuple(other["w"])
    assert canonical_json(after.describe()) != canonical_json(before.describe())
    # pinning the same fit again changes nothing
    assert plan.pin_fits([other]) is False
    assert (canonical_json(make_mechanism("blt", P, T, ZCDP(0.5)).describe())
            == canonical_json(after.describe()))


def test_a_pinned_fit_is_exact_through_json() -> None:
    import json

    make_mechanism("blt", P, T, ZCDP(0.5))
    fits = json.loads(json.dumps(plan.fits_used()))
    want = canonical_json(make_mechanism("blt", P, T, ZCDP(0.5)).describe())
    plan._USED.clear()
    plan.fit.cache_clear()
    assert plan.pin_fits(fits) is False
    assert canonical_json(make_mechanism("blt", P, T, ZCDP(0.5)).describe()) == want


@pytest.mark.parametrize(
    ("bad", "match"),
    [({"p": P, "n": T, "theta": [0.5, 1.0], "w": [0.1, 0.1]}, "stable"),
     ({"p": P, "n": T, "theta": [0.5], "w": [-0.1]}, "stable"),
     ({"p": P, "n": T, "theta": [float("nan")], "w": [0.1]}, "stable"),
     ({"p": P, "n": T, "theta": [0.5] * 9, "w": [0.01] * 9}, "stable"),
     ({"p": P, "n": T, "theta": [0.5], "w": [0.1, 0.1]}, "stable"),
     ({"p": P, "n": "255", "theta": [0.5], "w": [0.1]}, "malformed"),
     ({"p": P, "theta": [0.5], "w": [0.1]}, "malformed"),
     ({"p": 1.5, "n": T, "theta": [0.5], "w": [0.1]}, "stable")],
)
def test_a_malformed_or_unstable_fit_is_refused_and_nothing_pinned(
    bad: dict[str, Any], match: str
) -> None:
    good = {"p": 0.5, "n": 63, "theta": [0.5], "w": [0.1]}
    with pytest.raises(ValueError, match=match):
        plan.pin_fits([good, bad])
    assert (0.5, 63) not in plan._PINNED


def test_the_nonce_record_carries_the_fits_sealed() -> None:
    s = Settings(domain_file="unused.toml", origin=1_000_000.0)
    fits = [{"p": P, "n": T, "theta": [0.9, 0.5], "w": [0.1, 0.2]}]
    rec = nonce_record(s, DIGEST, KEY, "ab" * 32, fits)
    assert parse_nonce_record(s, DIGEST, KEY, rec) == ("ab" * 32, fits)
    assert parse_nonce(s, DIGEST, KEY, rec) == "ab" * 32
    # a record written before fits were recorded: no fits
    old = nonce_record(s, DIGEST, KEY, "cd" * 32)
    assert parse_nonce_record(s, DIGEST, KEY, old) == ("cd" * 32, [])
    assert b"fits" not in old
    # the fits are under the MAC: a changed digit is not authentic
    forged = rec.replace(b"0.9", b"0.8")
    assert forged != rec and parse_nonce_record(s, DIGEST, KEY, forged) is None
    assert parse_nonce_record(s, DIGEST, bytes(32), rec) is None


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"),
                    reason="OpenBLAS core types named here are x86-64 ones")
def test_another_kernel_lands_on_another_fit_unless_pinned(tmp_path: Path) -> None:
    """The reason for all this, reproduced: the same fit made under two of OpenBLAS's kernels
    (one process each, empty caches) differs, and pinning the first one's makes the second
    build the first one's mechanism."""
    code = (
        "import json, sys\n"
        "from stream_dp.budget import ZCDP\n"
        "from stream_dp.planner import make_mechanism\n"
        "from stream_dp.strategies.blt import plan\n"
        "pins = json.loads(sys.argv[1])\n"
        "if pins: plan.pin_fits(pins)\n"
        "m = make_mechanism('blt', 0.95, 4095, ZCDP(0.5))\n"
        "print(json.dumps([m.describe()['theta'].tolist(), m.describe()['sigma_units'],"
        " plan.fits_used()]))\n"
    )

    def run(core: str, pins: list[Any]) -> list[Any]:
        env = {**os.environ, "OPENBLAS_CORETYPE": core, "OPENBLAS_NUM_THREADS": "1",
               "STREAM_DP_CACHE_DIR": str(tmp_path / f"cache-{core}-{len(pins)}")}
        out = subprocess.run([sys.executable, "-c", code, __import__("json").dumps(pins)],
                             env=env, capture_output=True, text=True, check=True, timeout=600)
        return list(__import__("json").loads(out.stdout))

    first = run("Haswell", [])
    other = run("Prescott", [])
    if other[:2] == first[:2]:
        pytest.skip("this CPU's kernels give the same fit (nothing to pin here)")
    pinned = run("Prescott", first[2])
    assert pinned[:2] == first[:2]
