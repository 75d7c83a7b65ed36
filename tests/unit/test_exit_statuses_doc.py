"""docs/exit-statuses.md lists every exit status each command's code can return (issue 32:
the runbooks left out status 4). The statuses are read from the code itself (``return N``,
``SystemExit(N)``, ``parser.exit(N, …)``, ``out.finish(…, N)``, ``EXIT_* = N``), so a new status
without a line in the document fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "exit-statuses.md"

#: document section -> the modules whose run() decides that command's exit status
SECTIONS: dict[str, list[str]] = {
    "Every command": ["stream_dp/cli.py", "agents/kafka/clients.py"],
    "stream-dp demo": ["agents/commands/demo.py", "stream_dp/commands/demo_offline.py"],
    "stream-dp plan · stream-dp marginals": ["stream_dp/commands/plan.py",
                                             "stream_dp/commands/marginals.py"],
    "stream-dp worker": ["agents/commands/worker.py", "agents/worker/processes.py"],
    "stream-dp broker": ["agents/commands/broker.py"],
    "stream-dp topics": ["agents/commands/topics.py"],
    "stream-dp tail": ["agents/commands/tail.py"],
    "stream-dp replay": ["agents/commands/replay.py"],
    "stream-dp simulate": ["simulators/cli.py", "agents/commands/simulate.py"],
    "python -m agents.dashboard": ["agents/dashboard/__main__.py"],
}
#: functions whose integer results are not exit statuses (tree depths)
NOT_STATUSES = {"_depth"}


def _int(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def statuses_in(path: Path) -> set[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = {t.id: _int(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name) and t.id.startswith("EXIT_")}
    found: set[int] = {v for v in constants.values() if v is not None}

    def value(node: ast.AST | None) -> list[int]:
        if isinstance(node, ast.IfExp):
            return value(node.body) + value(node.orelse)
        if isinstance(node, ast.Name) and constants.get(node.id) is not None:
            return [constants[node.id]]  # type: ignore[list-item]
        v = _int(node)
        return [] if v is None else [v]

    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name in NOT_STATUSES:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Return):
                found.update(value(node.value))
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in ("SystemExit", "exit") and node.args:
                    found.update(value(node.args[0]))
                elif name == "finish" and len(node.args) >= 2:
                    found.update(value(node.args[1]))
    return found


def documented(section: str) -> set[int]:
    text = DOC.read_text(encoding="utf-8")
    body = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert body, f"docs/exit-statuses.md has no section '## {section}'"
    return {int(s) for s in re.findall(r"^\| (\d+) \|", body.group(1), re.M)}


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_status_in_the_code_is_documented(section: str) -> None:
    common = documented("Every command")
    codes = set().union(*(statuses_in(ROOT / m) for m in SECTIONS[section]))
    missing = codes - documented(section) - common
    assert not missing, f"{section}: statuses {sorted(missing)} are not in docs/exit-statuses.md"


def test_the_worker_status_4_is_there_and_the_runbooks_link_it() -> None:
    assert 4 in documented("stream-dp worker")
    for doc in ("runbooks.md", "troubleshooting.md", "operations.md"):
        assert "exit-statuses.md" in (ROOT / "docs" / doc).read_text(encoding="utf-8"), doc
