"""Reading and checking setting values: environment variable names, type coercion of raw
values (environment or TOML), range checks and reading TOML files.
"""

from __future__ import annotations

import math
import os
from typing import Any

from stream_dp import _toml


def env_var(name: str) -> str:
    """The environment variable of setting ``name``: ``STREAM_DP_<NAME>``."""
    return "STREAM_DP_" + name.upper()


def bootstrap_problem(value: str) -> str | None:
    """Why ``value`` is not a comma-separated list of ``host[:port]`` broker addresses (``[v6]``
    in brackets), or ``None``. Checked before any client sees it: the client's own error is
    ``invalid literal for int() with base 10``."""
    for item in value.split(","):
        item = item.strip()
        if not item:
            return f"{value!r} has an empty address (write host:port[,host:port...])"
        host, port = item, ""
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            if rest and not rest.startswith(":"):
                return f"{item!r} is not [IPv6-address]:port"
            port = rest[1:]
        elif item.count(":") == 1:
            host, port = item.split(":")
        if not host:
            return f"{item!r} has no host (write host:port, e.g. 127.0.0.1:9092)"
        if (port or item.endswith(":")) and not (port.isdigit() and 0 < int(port) < 65536):
            return (f"{item!r} has port {port!r}, not a number in 1..65535 "
                    "(write host:port, e.g. 127.0.0.1:9092)")
    return None


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


def _check_float(name: str, value: object, lo: float, lo_open: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v > lo if lo_open else v >= lo)
    if not ok:
        rng = f"> {lo:g}" if lo_open else f">= {lo:g}"
        raise ValueError(f"{name} must be a finite number {rng}, got {value!r}")


def _coerce(name: str, typ: Any, raw: Any) -> Any:
    kind = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if kind == "int":
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, str):
                return int(raw.strip())
            if isinstance(raw, float) and raw.is_integer():
                return int(raw)
            if not isinstance(raw, int):
                raise ValueError
            return raw
        if kind == "float":
            if isinstance(raw, bool):
                raise ValueError
            return float(raw.strip()) if isinstance(raw, str) else float(raw)
        if kind == "str":
            if not isinstance(raw, str):
                raise ValueError
            return raw
        if kind == "bool":
            from agents.config.security import parse_bool

            return parse_bool(name, raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be of type {kind}, got {raw!r}") from None
    raise ValueError(f"{name}: unsupported setting type {kind}")  # pragma: no cover


def _read_toml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """A TOML file's table; ``ValueError`` naming the file for every reason it cannot be read
    (missing, unreadable, not UTF-8, not TOML)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ValueError(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    from stream_dp._text import decode_utf8

    text = decode_utf8(raw, f"{what} {str(path)!r}")
    try:
        return _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise ValueError(f"{what} {str(path)!r} is not valid TOML: {exc}") from None
