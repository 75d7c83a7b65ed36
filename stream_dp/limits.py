"""Valid ranges of every mechanism parameter, checked before anything is built or connected.

Each check raises :class:`ValueError` with **one line** that names the parameter (as the user
spelled it: pass ``names`` to say ``--epsilon`` or ``epsilon``) and its valid range. The command
line and the worker's settings call :func:`check_parameters` first, so a value outside these
ranges is refused at start-up with exit status 2, never as a traceback, a hang or an
out-of-memory kill in the middle of a run.

======================  =====================================  ===========================================
parameter               valid range                            why
======================  =====================================  ===========================================
``p``                   [1e-6, 1]                              decay per tick; below 1e-6 a tick keeps
                                                               nothing of the past (p² underflows in the
                                                               strategies' weight recursions)
``horizon``             [1, 2**24 − 1] = [1, 16 777 215] ticks strategies keep O(horizon) tables (about
                                                               100 bytes per tick of horizon); streams roll
                                                               into a new epoch after it, so a longer one is
                                                               never needed
``epsilon`` (pure)      [1e-6, 1e6] per event and stream       below: the noise scale leaves the exact
                                                               samplers' range (2**50 grid units); above:
                                                               the noise is below the rounding grid
``rho`` (zCDP)          [1e-12, 1e12]                          the same, for ρ (≈ ε²/2)
``cap``                 [1e-6, 1e9]                            contribution bound of one event
``delta``               (0, 1)                                 δ of the implied (ε, δ)-DP
``cap`` with integer    a whole number                         the integer-grid strategies need whole counts
counts
======================  =====================================  ===========================================

Some strategies refuse part of these ranges for a given cap (e.g. ``naive-int`` noise on the
integer grid cannot follow ε above about 1e3): :func:`stream_dp.planner.check_buildable` builds
the mechanism and turns its refusal into the same one-line error.

**Layering** (issue #26): this module is the bottom of strategy selection — it imports nothing
from ``stream_dp``; the registry (:mod:`stream_dp.strategies.registry`) checks its arguments with
:func:`check_parameters`, and the planner sits above both (:func:`stream_dp.planner.check_buildable`,
which builds mechanisms, lives there).

Memory: :func:`estimate_memory` bounds the bytes one worker needs for a strategy's tables and
``n_streams`` streams; :func:`check_memory` refuses what does not fit a limit.

>>> check_parameters(p=0.9, horizon=4095, epsilon=1.0, cap=1.0)
>>> check_parameters(p=0.9, horizon=4095, epsilon=1e-300)
Traceback (most recent call last):
...
ValueError: epsilon must be in [1e-06, 1e+06] (ε per event and stream; a finite number), got 1e-300
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "CAP_RANGE",
    "EPSILON_RANGE",
    "HORIZON_MAX",
    "P_RANGE",
    "RHO_RANGE",
    "MemoryEstimate",
    "check_memory",
    "check_parameters",
    "estimate_memory",
]

#: Largest horizon (ticks per epoch) of any strategy: 2**24 − 1.
HORIZON_MAX = (1 << 24) - 1
#: Valid decay per tick, inclusive.
P_RANGE = (1e-6, 1.0)
#: Valid ε per event and stream (pure DP), inclusive.
EPSILON_RANGE = (1e-6, 1e6)
#: Valid ρ per event and stream (zCDP), inclusive.
RHO_RANGE = (1e-12, 1e12)
#: Valid contribution cap, inclusive.
CAP_RANGE = (1e-6, 1e9)

#: Upper bound on the bytes of a strategy's shared tables per tick of horizon (measured: dm 45,
#: tree 52, sqrt 75 bytes per tick at horizon 2**24 − 1; the planner's curves add 8 per tick).
TABLE_BYTES_PER_TICK = 128
#: Fixed overhead of one mechanism and bank (interpreter objects, small tables), bytes.
BASE_BYTES = 64 << 20
#: Working copies of the per-stream state during a tick (state, step temporaries, checkpoint).
STATE_COPIES = 4


def _label(names: Mapping[str, str] | None, key: str) -> str:
    return (names or {}).get(key, key)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            import numpy as np

            if isinstance(value, np.integer | np.floating):
                return float(value)
        except ImportError:  # pragma: no cover - numpy is a dependency
            pass
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _check_range(
    label: str, value: object, lo: float, hi: float, what: str, *, lo_open: bool = False,
    hi_open: bool = False,
) -> None:
    v = _number(value)
    ok = (
        v is not None
        and math.isfinite(v)
        and (v > lo if lo_open else v >= lo)
        and (v < hi if hi_open else v <= hi)
    )
    if not ok:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise ValueError(
            f"{label} must be in {left}{lo:g}, {hi:g}{right} ({what}; a finite number), "
            f"got {value!r}"
        )


def check_parameters(
    *,
    p: float | None = None,
    horizon: int | None = None,
    epsilon: float | None = None,
    rho: float | None = None,
    cap: float | None = None,
    delta: float | None = None,
    integer_counts: bool = False,
    names: Mapping[str, str] | None = None,
) -> None:
    """Refuse any given parameter outside its valid range (module table); ``None`` = not given.

    ``names`` maps a parameter to the name shown in the message (e.g. ``{"epsilon":
    "--epsilon"}``). Raises ``ValueError`` (one line, naming the parameter and its range).
    """
    if p is not None:
        # the documented (0, 1] first (its message is an interface), then the practical floor
        _check_range(_label(names, "p"), p, 0.0, 1.0, "decay per tick", lo_open=True)
        if float(p) < P_RANGE[0]:
            raise ValueError(
                f"{_label(names, 'p')} must be at least {P_RANGE[0]:g} (decay per tick: below it "
                f"a tick keeps nothing of the past), got {p!r}"
            )
    if horizon is not None:
        label = _label(names, "horizon")
        if (
            isinstance(horizon, bool)
            or not isinstance(horizon, int)
            or not 1 <= horizon <= HORIZON_MAX
        ):
            raise ValueError(
                f"{label} must be an integer in [1, {HORIZON_MAX}] (2**24 - 1; ticks per horizon period, "
                f"streams roll over into the next horizon period after it), got {horizon!r}"
            )
    if epsilon is not None:
        _check_range(
            _label(names, "epsilon"), epsilon, *EPSILON_RANGE, "ε per event and stream"
        )
    if rho is not None:
        _check_range(_label(names, "rho"), rho, *RHO_RANGE, "ρ per event and stream")
    if cap is not None:
        _check_range(_label(names, "cap"), cap, *CAP_RANGE, "largest contribution of one event")
        if integer_counts and not float(cap).is_integer():
            raise ValueError(
                f"{_label(names, 'cap')} must be a whole number with "
                f"{_label(names, 'integer_counts')} (counts are sums of whole-number "
                f"contributions), got {cap!r}"
            )
    if delta is not None:
        _check_range(
            _label(names, "delta"), delta, 0.0, 1.0, "δ of the implied (ε, δ)-DP",
            lo_open=True, hi_open=True,
        )


@dataclass(frozen=True)
class MemoryEstimate:
    """Upper bound on the memory a worker needs for one mechanism and ``n_streams`` streams."""

    tables_bytes: int
    per_stream_bytes: int
    n_streams: int

    @property
    def total_bytes(self) -> int:
        return BASE_BYTES + self.tables_bytes + self.per_stream_bytes * self.n_streams


def estimate_memory(
    strategy: str, horizon: int, n_streams: int, model: str = "pure"
) -> MemoryEstimate:
    """Bound the memory of ``strategy`` (any name, ``auto`` included) at ``horizon``.

    Tables: :data:`TABLE_BYTES_PER_TICK` per tick of horizon (the Fenwick, tree and Toeplitz
    tables and the planner's error curves are all O(horizon)). Per stream: one float64 per
    Fenwick/tree level and per Toeplitz tap kept (at most 512), ``tree-ls``'s residuals (at most
    273) and the p = 1 super levels of ``tree-ls``/``blt`` (3 × 41), times :data:`STATE_COPIES`.
    Cheap: builds nothing.
    """
    levels = max(1, int(horizon).bit_length()) + 2
    per_level = 8 * 4  # a value, a weight, a partial sum and a counter per level
    toeplitz = strategy == "sqrt" or (strategy == "auto" and model == "zcdp")
    taps = 512 * 8 if toeplitz else 0
    # tree-ls: ≤ 273 int64 residuals (four levels: B/L₁ ≤ 256, B/L₂ ≤ 16); tree-ls and blt at
    # p = 1: three arrays of ≤ 41 super levels
    residuals = 273 * 8 if strategy in ("tree-ls", "auto") else 0
    epochs = 3 * 41 * 8 if strategy in ("tree-ls", "blt", "blt-horizon", "auto") else 0
    per_stream = STATE_COPIES * (levels * per_level + taps + residuals + epochs + 64)
    return MemoryEstimate(TABLE_BYTES_PER_TICK * int(horizon), per_stream, int(n_streams))


def check_memory(
    strategy: str,
    horizon: int,
    n_streams: int,
    limit_bytes: int,
    *,
    model: str = "pure",
    setting: str = "memory limit",
) -> MemoryEstimate:
    """Refuse (one-line ``ValueError``) a configuration whose estimate exceeds ``limit_bytes``."""
    est = estimate_memory(strategy, horizon, n_streams, model)
    if est.total_bytes > limit_bytes:
        mib = 1 << 20
        raise ValueError(
            f"horizon {horizon} with {n_streams} streams needs up to "
            f"{est.total_bytes / mib:.0f} MiB (strategy {strategy}: tables "
            f"{est.tables_bytes / mib:.0f} MiB, {est.per_stream_bytes} bytes per stream), above "
            f"the {setting} of {limit_bytes / mib:.0f} MiB: use a shorter horizon (streams roll "
            "over into the next horizon period after it), fewer streams per worker, or raise the limit"
        )
    return est

