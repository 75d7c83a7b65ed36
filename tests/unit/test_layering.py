"""Import layering of the whole code (issue #33, "the house"; before it #12 and #26).

The contracts are declared in ``pyproject.toml`` (``[tool.importlinter]``) and checked by
import-linter, which reads every import of ``stream_dp``, ``agents`` and ``simulators`` from the
source: at module level, inside functions (lazy imports, a module ``__getattr__`` alias) and under
``if TYPE_CHECKING:`` alike. ``scripts/test`` runs ``lint-imports`` before the tests; this file
runs it too, and shows on a copy of the tree that each kind of forbidden arrow breaks a contract
(else a kept contract would prove nothing):

* ``library``: ``stream_dp`` never imports the service, the simulators or a Kafka client;
* ``service-layers``: ``agents`` packages import only the layers below them
  (docs/architecture.md draws them);
* ``pure-state``: the settings, the telemetry and the pure stage states never reach aiokafka;
* ``strategy-selection``: limits < registry < figures < planner < analysis in the library;
* ``no-circles``: no import circle at any depth of any of the three packages.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stream_dp", "agents", "simulators")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the tree at ``root`` (its pyproject.toml), the given contracts only."""
    args = [str(LINT_IMPORTS), "--no-cache"]
    for contract in contracts:
        args += ["--contract", contract]
    return subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=300,
                          check=False, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the sources and of pyproject.toml, to inject arrows into."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "static", "fits"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: Path, code: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + "\n" + textwrap.dedent(code),
                    encoding="utf-8")


def test_every_contract_holds() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(("module", "code", "contract"), [
    # a module-level arrow from the plumbing up to the worker
    ("agents/kafka/groups.py", "from agents.worker import pipeline\n", "service-layers"),
    # a lazy (function-level) arrow from ingest up to release
    ("agents/ingest/routing.py",
     "def _late() -> object:\n    from agents.release.state import ReleaseState\n"
     "    return ReleaseState\n", "service-layers"),
    # a type-only arrow from a stage up to the pipeline (the back-reference issue #33 removed)
    ("agents/release/stage.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from agents.worker.pipeline import Worker\n", "service-layers"),
    # the settings reaching a Kafka client
    ("agents/config/values.py", "def _k() -> None:\n    import aiokafka\n", "pure-state"),
    # the library naming the service
    ("stream_dp/budget.py", "def _s() -> None:\n    import agents.config.settings\n", "library"),
])
def test_an_upward_arrow_breaks_the_contract(tree: Path, module: str, code: str,
                                             contract: str) -> None:
    assert _lint(tree, contract).returncode == 0
    _append(tree / module, code)
    out = _lint(tree, contract)
    assert out.returncode != 0, out.stdout
    assert "BROKEN" in out.stdout


@pytest.mark.parametrize(("module", "code"), [
    # a circle through a type-only import (what reconcile ↔ leader was)
    ("agents/reconcile/leader.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from agents.reconcile.agent import Reconciler\n"),
    # a circle through a lazy module alias (what stream_dp.limits.check_buildable was)
    ("stream_dp/limits.py",
     "def __getattr__(name: str) -> object:\n    from stream_dp.planner import check_buildable\n"
     "    return check_buildable\n"),
])
def test_a_circle_breaks_the_contract(tree: Path, module: str, code: str) -> None:
    assert _lint(tree, "no-circles").returncode == 0
    _append(tree / module, code)
    out = _lint(tree, "no-circles")
    assert out.returncode != 0, out.stdout
    assert "BROKEN" in out.stdout


def test_package_inits_hold_only_their_contract() -> None:
    """Each ``__init__.py`` of ``agents`` is a docstring that says what the package holds, what
    it may import and what it must not; it imports nothing (no re-exports: a name is imported
    from the module that defines it). The dashboard's names are the one documented exception
    (``make_dashboard_app``: the worker's web server mounts it by module name)."""
    import ast

    for init in sorted((ROOT / "agents").rglob("__init__.py")):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree) or ""
        where = init.relative_to(ROOT)
        if init.parent != ROOT / "agents":
            assert "May import" in doc and "Must not" in doc, where
        body = [type(n).__name__ for n in tree.body]
        if init.parent.name == "dashboard":
            body = [b for b in body if b not in ("ImportFrom", "Assign")]
        assert body == ["Expr"], where


@pytest.mark.parametrize(
    "module",
    ["stream_dp.limits", "stream_dp.strategies.registry", "stream_dp.strategies",
     "stream_dp.figures", "stream_dp.planner", "stream_dp.analysis",
     "stream_dp.strategies.tree", "stream_dp.strategies.fenwick.dmfda"],
)
def test_each_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    """Whichever module is imported first, the import succeeds and ``auto`` resolves."""
    code = (
        f"import importlib; importlib.import_module({module!r}); "
        "from stream_dp.planner import make_mechanism; from stream_dp.budget import PureDP; "
        "print(make_mechanism('auto', 0.3, 63, PureDP(1.0)).name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "naive"
