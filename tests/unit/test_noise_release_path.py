"""No insecure randomness in the release path (DESIGN.md §2.4), checked over the source text.

The release path is the noise package, the mechanism contract, the counters and every
strategy: none of them may use ``random``, ``numpy.random`` (in particular its floating-point
``laplace``/``normal`` samplers) or ``secrets`` — all noise comes from ``stream_dp.noise``. The
whole library must never call a floating-point Laplace sampler.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import stream_dp

PACKAGE = Path(stream_dp.__file__).resolve().parent
RELEASE_PATH = [
    PACKAGE / "noise",
    PACKAGE / "strategies",
    PACKAGE / "mechanism.py",
    PACKAGE / "counters.py",
    PACKAGE / "budget.py",
    PACKAGE / "accounting.py",
]
FORBIDDEN_MODULES = {"random", "secrets", "numpy.random"}
FORBIDDEN_CALLS = re.compile(r"\b(?:random\.|default_rng|RandomState|laplace\(|\.normal\(|rand\()")


def _files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        out.extend(sorted(p.rglob("*.py")) if p.is_dir() else ([p] if p.exists() else []))
    return out


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _code_without_strings(source: str) -> str:
    """Source with docstrings/strings and comments blanked (so prose may mention them)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for ln in range(node.lineno - 1, (node.end_lineno or node.lineno)):
                lines[ln] = ""
    return "\n".join(re.sub(r"#.*", "", line) for line in lines)


def test_release_path_files_exist() -> None:
    files = _files(RELEASE_PATH)
    assert PACKAGE / "noise" / "keyed.py" in files
    assert len(files) >= 8


def test_release_path_imports_no_insecure_rng() -> None:
    for path in _files(RELEASE_PATH):
        imported = _imports(ast.parse(path.read_text()))
        bad = {m for m in imported if m in FORBIDDEN_MODULES or m.startswith("numpy.random")}
        assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


def test_release_path_calls_no_insecure_sampler() -> None:
    for path in _files(RELEASE_PATH):
        code = _code_without_strings(path.read_text())
        for m in FORBIDDEN_CALLS.finditer(code):
            raise AssertionError(f"{path.relative_to(PACKAGE)} uses {m.group(0)!r}")
        assert "np.random" not in code and "numpy.random" not in code, path


def test_no_float_laplace_anywhere_in_the_library() -> None:
    pattern = re.compile(r"random\.laplace|\.laplace\(|random\.exponential")
    for path in _files([PACKAGE]):
        code = _code_without_strings(path.read_text())
        assert not pattern.search(code), f"{path.relative_to(PACKAGE)} samples float Laplace"


def test_the_checker_catches_violations() -> None:
    bad = "import numpy as np\nx = np.random.laplace(0, 1)\nimport random\n"
    assert "random" in _imports(ast.parse(bad))
    assert FORBIDDEN_CALLS.search(_code_without_strings(bad))
    assert not FORBIDDEN_CALLS.search(_code_without_strings('"""uses random.laplace"""\n'))
