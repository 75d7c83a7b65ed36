"""Import layering of the library (issues #12 and #26, "the house"): limits < registry < figures
< planner < analysis, checked on the source with an AST scan (no imports executed).

* no cycle among the modules' imports, **at any level** (deferred, function-level imports
  included): the circle limits → strategies.make_mechanism → planner → registry → limits is gone;
* the registry and limits import neither the planner nor the analysis, at any level, and neither
  does anything they import;
* the planner does not import the analysis (the analysis sits above it: ``expected_mse("auto")``).

Two names stay importable where they were, as *lazy aliases* of the planner's functions:
``stream_dp.strategies.make_mechanism`` and ``stream_dp.limits.check_buildable``. An alias is a
module-level ``def __getattr__`` (PEP 562) that returns a function of a module above; the scan
records its import as an alias, not a dependency, and a test checks that each alias *is* the
planner's function (one implementation, reachable from one place). ``if TYPE_CHECKING:`` imports
are never executed and are skipped too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "stream_dp"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str, known: set[str]) -> tuple[set[str], set[str]]:
    """(module-level imports, all imports) of ``stream_dp`` modules in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top: set[str] = set()
    every: set[str] = set()
    toplevel_nodes = set(map(id, tree.body))
    skipped: set[int] = set()
    for node in tree.body:
        alias = isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
        typing_only = isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING", "typing.TYPE_CHECKING"
        )
        if alias or typing_only:
            skipped.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import submodule` depends on the submodule (the package itself runs
            # first in any case, as the parent of every submodule); `from m import name` on m
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            names = subs if len(subs) == len(node.names) else [base, *subs]
        names = [n for n in names if n == "stream_dp" or n.startswith("stream_dp.")]
        every.update(names)
        if id(node) in toplevel_nodes:
            top.update(names)
    return top, every


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    top: dict[str, set[str]] = {}
    every: dict[str, set[str]] = {}
    for name, path in files.items():
        t, e = _imports(path, name, set(files))
        top[name] = {m for m in t if m in files and m != name}
        every[name] = {m for m in e if m in files and m != name}
    return top, every


def _closure(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (found := visit(n)) is not None:
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_scan_sees_the_known_edges() -> None:
    """The scan itself works: it finds imports that exist (else the other tests prove nothing)."""
    top, every = _graph()
    assert "stream_dp.strategies.registry" in top["stream_dp.strategies"]
    assert "stream_dp.planner" in every["stream_dp.analysis"]
    assert "stream_dp.figures" in top["stream_dp.planner"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_cycle_among_import_time_imports() -> None:
    top, _ = _graph()
    assert _find_cycle(top) is None


@pytest.mark.parametrize("module", ["stream_dp.strategies.registry", "stream_dp.figures"])
def test_registry_and_figures_do_not_depend_on_planner_or_analysis(module: str) -> None:
    top, every = _graph()
    reach = _closure(top, every[module])
    assert "stream_dp.planner" not in reach | every[module]
    assert "stream_dp.analysis" not in reach | every[module]


def test_planner_does_not_import_the_analysis() -> None:
    top, every = _graph()
    assert "stream_dp.analysis" not in _closure(top, every["stream_dp.planner"])
    assert "stream_dp.analysis" not in every["stream_dp.planner"]


def test_no_cycle_even_through_deferred_imports() -> None:
    """Issue #26: no known upward exceptions any more; any cycle at any level fails (the whole
    library, not only strategy selection)."""
    _, every = _graph()
    assert _find_cycle(every) is None


@pytest.mark.parametrize("module", ["stream_dp.limits", "stream_dp.strategies.registry"])
def test_limits_and_registry_sit_below_the_planner(module: str) -> None:
    _, every = _graph()
    reach = _closure(every, every[module])
    assert "stream_dp.planner" not in reach
    assert "stream_dp.figures" not in reach
    assert "stream_dp.analysis" not in reach
    # and the registry checks its arguments with the bottom layer's ranges
    if module == "stream_dp.strategies.registry":
        assert "stream_dp.limits" in every[module]


def test_limits_imports_nothing_of_the_library() -> None:
    _, every = _graph()
    assert every["stream_dp.limits"] == set()


def test_the_aliases_are_the_planners_functions() -> None:
    """One implementation, reachable from one place: the old import paths are the same objects."""
    import stream_dp.limits as limits
    import stream_dp.planner as planner
    import stream_dp.strategies as strategies
    from stream_dp.limits import check_buildable
    from stream_dp.strategies import make_mechanism

    assert make_mechanism is planner.make_mechanism is strategies.make_mechanism
    assert check_buildable is planner.check_buildable is limits.check_buildable
    with pytest.raises(AttributeError):
        _ = strategies.no_such_name  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        _ = limits.no_such_name  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "module",
    ["stream_dp.limits", "stream_dp.strategies.registry", "stream_dp.strategies",
     "stream_dp.figures", "stream_dp.planner", "stream_dp.analysis",
     "stream_dp.strategies.tree", "stream_dp.strategies.fenwick.dmfda"],
)
def test_each_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    """Whichever module is imported first, the import succeeds and ``auto`` resolves."""
    import subprocess
    import sys

    code = (
        f"import importlib; importlib.import_module({module!r}); "
        "from stream_dp.strategies import make_mechanism; from stream_dp.budget import PureDP; "
        "print(make_mechanism('auto', 0.3, 63, PureDP(1.0)).name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "naive"
