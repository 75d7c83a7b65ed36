"""Root pytest configuration: doctest collection of the library.

The old module paths kept after the strategy families moved into subpackages (e.g.
``stream_dp/tree_plan.py``) replace themselves in ``sys.modules`` by the new module, so
``--doctest-modules`` would collect the same module under two file names and refuse it. Their
doctests run where the code now lives; the shims are left out of doctest collection here.
"""

from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).parent
_SHIM_MARK = "sys.modules[__name__] = "

collect_ignore = [
    str(path.relative_to(_ROOT))
    for path in sorted((_ROOT / "stream_dp").rglob("*.py"))
    if _SHIM_MARK in path.read_text(encoding="utf-8")
]
