"""The TOML parser every file of ours is read with (domain, settings, attribute domains).

The compiled ``tomli`` wheel when installed (a dependency): it parses a domain file of
2·10^6 paths in 1.88 s against the standard library's 3.57 s (the stdlib's ``tomllib`` is the
same parser, pure Python); otherwise ``tomllib``. Both raise :class:`TOMLDecodeError` (a
``ValueError``) for a document that is not TOML.
"""

from __future__ import annotations

try:
    from tomli import TOMLDecodeError, load, loads
except ImportError:  # pragma: no cover - tomli is a dependency; the stdlib has its parser
    from tomllib import TOMLDecodeError, load, loads  # type: ignore[assignment]

__all__ = ["TOMLDecodeError", "load", "loads"]
