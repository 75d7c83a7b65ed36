"""docs/architecture.md matches the code: every module, folder and dotted name it mentions
exists, every package of ``agents`` is in its table, and the README links to it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
TEXT = DOC.read_text(encoding="utf-8")


def _paths(text: str) -> set[str]:
    """Source paths the text names: ``agents/...``, ``stream_dp/...``, ``simulators/...``."""
    return set(re.findall(r"\b((?:agents|stream_dp|simulators)/[\w./-]*\w/?)", text))


def _dotted(text: str) -> set[str]:
    """Dotted names in backticks: ``stream_dp.counters.CounterBank``, ``agents.dashboard``."""
    return {m for m in re.findall(r"`((?:agents|stream_dp)(?:\.\w+)+)`", text)}


def _table_rows(text: str) -> list[tuple[str, list[str]]]:
    """(package folder, file names in the row) of the package table."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"\| `(agents/\w+/)` \|(.*)", line)
        if m:
            rows.append((m.group(1), re.findall(r"`([\w/]+(?:\.py|/))`", m.group(2))))
    return rows


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_path_it_names_exists() -> None:
    missing = sorted(p for p in _paths(TEXT) if not (ROOT / p).exists())
    assert missing == []


def test_every_dotted_name_it_names_exists() -> None:
    assert sorted(n for n in _dotted(TEXT) if not _resolves(n)) == []


def test_the_package_table_names_real_modules_and_every_package() -> None:
    rows = _table_rows(TEXT)
    missing = [f"{pkg}{name}" for pkg, names in rows for name in names
               if not (ROOT / pkg / name).exists()]
    assert missing == []
    packages = {p.parent.name for p in (ROOT / "agents").glob("*/__init__.py")}
    assert {pkg.split("/")[1] for pkg, _ in rows} == packages


def test_the_checks_catch_a_module_that_does_not_exist() -> None:
    """The extraction works (else the tests above would pass on nothing)."""
    text = "see `agents/kafka/nowhere.py` and `stream_dp.counters.NoSuchThing`\n" \
           "| `agents/kafka/` | `nowhere.py`, `stage.py` | yes |"
    assert [p for p in _paths(text) if not (ROOT / p).exists()] == ["agents/kafka/nowhere.py"]
    assert [n for n in _dotted(text) if not _resolves(n)] == ["stream_dp.counters.NoSuchThing"]
    assert _table_rows(text) == [("agents/kafka/", ["nowhere.py", "stage.py"])]
    assert len(_paths(TEXT)) > 40 and len(_table_rows(TEXT)) >= 9


def test_readme_links_it() -> None:
    assert "](docs/architecture.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
