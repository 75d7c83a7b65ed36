"""Every test the docs name as evidence exists: the threat model's rows (docs/privacy.md) and the
other pages cite ``tests/…py`` files and ``::test_…`` functions, and a moved or renamed test
must not leave a claim pointing at nothing (issue 33's move left eight such paths)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md"])
# a path, optionally followed by ::name; a bare ::name refers to the last path on the same line
CITE = re.compile(r"(tests/[A-Za-z0-9_/]+\.py)?::([A-Za-z_][A-Za-z0-9_]*)|(tests/[A-Za-z0-9_/]+\.py)")


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def _citations() -> list[tuple[str, int, str, str | None]]:
    out: list[tuple[str, int, str, str | None]] = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            last: str | None = None
            for m in CITE.finditer(line):
                path, name, bare = m.group(1), m.group(2), m.group(3)
                if bare:
                    last = bare
                    out.append((page.name, number, bare, None))
                    continue
                last = path or last
                if last is not None:
                    out.append((page.name, number, last, name))
    return out


def test_the_docs_cite_tests() -> None:
    assert len(_citations()) > 50  # the reader below really reads the threat model


def test_every_cited_test_file_and_function_exists() -> None:
    missing = []
    cache: dict[str, set[str]] = {}
    for page, number, path, name in _citations():
        file = ROOT / path
        if not file.is_file():
            missing.append(f"{page}:{number}: {path}")
            continue
        if name is not None and name not in cache.setdefault(path, _defined(file)):
            missing.append(f"{page}:{number}: {path}::{name}")
    assert not missing, "docs cite tests that do not exist:\n" + "\n".join(missing)
