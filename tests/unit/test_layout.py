"""Architecture rules: the library never imports Kafka or the service; the service holds no maths."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_LIBRARY = ("faust", "aiokafka", "kafka", "agents", "mode")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_library_sources_never_import_kafka_or_service() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & set(FORBIDDEN_IN_LIBRARY))
        for path in (ROOT / "stream_dp").rglob("*.py")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}


def test_importing_every_library_module_loads_no_kafka_client() -> None:
    code = (
        "import importlib, pkgutil, sys, stream_dp\n"
        "for m in pkgutil.walk_packages(stream_dp.__path__, 'stream_dp.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in "
        f"{FORBIDDEN_IN_LIBRARY!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""


def test_service_holds_no_maths() -> None:
    """`agents` reaches numerics only through `stream_dp`: no scipy, no direct noise sampling."""
    offenders = {}
    for path in (ROOT / "agents").rglob("*.py"):
        bad = _imports(path) & {"scipy"}
        text = path.read_text(encoding="utf-8")
        if "np.random" in text or "numpy.random" in text:
            bad.add("numpy.random")
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}
