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


SERVICE_PACKAGES = ("agents", "simulators")


def _module_references(path: Path, packages: tuple[str, ...]) -> list[str]:
    """Imports of ``packages`` and string literals naming one of their modules (importlib)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in packages]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in packages:
                found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for word in node.value.replace("`", " ").replace("'", " ").split():
                head = word.strip(".,:;()[]{}\"").split(".")[0]
                if head in packages and ("." in word or word.strip(".,:;()\"") == head):
                    found.append(word)
    return found


def test_library_never_names_the_service_or_the_simulators() -> None:
    """`stream_dp` holds no import of, no module string naming, not even a word `agents` or
    `simulators` (code, strings, comments, data files): the library does not know the service."""
    import re

    word = re.compile(r"\b(?:agents|simulators)\b")
    offenders: dict[str, list[str]] = {}
    for path in sorted((ROOT / "stream_dp").rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        refs = word.findall(text)
        if path.suffix == ".py":
            refs += _module_references(path, SERVICE_PACKAGES)
        if refs:
            offenders[str(path.relative_to(ROOT))] = refs
    assert offenders == {}


def test_layout_check_catches_a_module_string(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('COMMANDS = {"worker": ("agents.commands.worker", "help")}\n')
    assert _module_references(bad, SERVICE_PACKAGES) == ["agents.commands.worker"]
    bad.write_text("from simulators.cli import run\n")
    assert _module_references(bad, SERVICE_PACKAGES) == ["simulators.cli"]


def test_simulators_depend_only_on_the_library() -> None:
    offenders = {
        str(path.relative_to(ROOT)): refs
        for path in (ROOT / "simulators").rglob("*.py")
        if (refs := _module_references(path, ("agents",)))
        or (refs := sorted(_imports(path) & set(FORBIDDEN_IN_LIBRARY)))
    }
    assert offenders == {}


def test_console_script_belongs_to_the_service_layer() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"]["stream-dp"] == "agents.cli:main"


def test_plan_runs_with_the_library_alone() -> None:
    """`python -m stream_dp.cli plan` never imports the service, Kafka or the simulators."""
    code = (
        "import sys\n"
        "from stream_dp.cli import main\n"
        "rc = main(['plan', '--p', '0.9', '--epsilon', '1', '--horizon', '15'])\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in "
        f"{(*FORBIDDEN_IN_LIBRARY, *SERVICE_PACKAGES)!r})\n"
        "print(rc, ','.join(bad), file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stderr.strip() == "0"


def test_console_script_plan_imports_no_kafka_client() -> None:
    """`stream-dp plan` (agents.cli) needs only the library: no Kafka client, no aiohttp."""
    code = (
        "import sys\n"
        "from agents.cli import main\n"
        "rc = main(['plan', '--p', '0.9', '--epsilon', '1', '--horizon', '15'])\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in "
        "('aiokafka', 'kafka', 'aiohttp', 'prometheus_client', 'orjson', 'jsonschema'))\n"
        "print(rc, ','.join(bad), file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stderr.strip() == "0"
