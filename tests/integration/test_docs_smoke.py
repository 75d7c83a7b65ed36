"""The README's and the guides' commands, run as written (so the docs cannot rot).

Every ```bash block in the documents below carries a marker comment just before it:

* ``<!-- smoke: run -->`` — the block runs as a bash script (``set -euo pipefail``) in an empty
  folder with the venv's commands on PATH and no ``STREAM_DP_*`` variables, and must exit 0;
* ``<!-- smoke: parse -->`` — every ``stream-dp ...`` command in it (after ``VAR=value``
  prefixes, through pipes and ``&&``) must be accepted by the command-line parser (no unknown
  option, no bad value): reference examples that need a particular deployment;
* ``<!-- smoke: skip: REASON -->`` — needs infrastructure outside this machine (Docker, kcat, a
  running deployment); the reason is shown.

A block without a marker fails the test, so a new example has to say how it is checked.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/guide.md", "docs/choosing.md", "docs/subscribe.md",
        "docs/troubleshooting.md", "docs/operations.md", "docs/runbooks.md", "docs/budget.md"]
_BLOCK = re.compile(r"(?:<!-- smoke: (?P<mark>[^>]*?) -->\s*\n)?[ \t]*```bash\n(?P<body>.*?)```",
                    re.S)


def _blocks() -> list[tuple[str, int, str, str]]:
    out = []
    for name in DOCS:
        text = (ROOT / name).read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            line = text[: m.start("body")].count("\n")
            out.append((name, line, (m.group("mark") or "").strip(), m.group("body")))
    return out


BLOCKS = _blocks()


def _id(block: tuple[str, int, str, str]) -> str:
    return f"{block[0]}:{block[1]}"


def test_every_block_says_how_it_is_checked() -> None:
    unmarked = [_id(b) for b in BLOCKS if not re.match(r"run$|parse$|skip: .+", b[2])]
    assert not unmarked, f"bash blocks without a smoke marker: {unmarked}"
    assert sum(b[2] == "run" for b in BLOCKS) >= 4


def _commands(body: str) -> list[list[str]]:
    """The ``stream-dp`` command lines of a block (continuations joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", body)
    found = []
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        current: list[str] = []
        skip_next = False
        for w in [*words, "|"]:
            if skip_next:
                skip_next = False
                continue
            redirect = re.match(r"^\d*(>>?|<)(&\d)?", w)
            if redirect:  # a redirection and its target are not arguments
                skip_next = redirect.group(0) == w and not redirect.group(2)
                continue
            if w in ("|", "&&", "||", ";", "&"):
                while current and re.match(r"^[A-Z_][A-Z0-9_]*=", current[0]):
                    current.pop(0)
                if current and current[0] == "stream-dp":
                    found.append(current[1:])
                current = []
            else:
                current.append(w)
    return found


def _parser(command: str) -> object:
    try:
        from agents.cli import build_parser  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        from stream_dp.cli import build_parser
    return build_parser(command)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[2] == "parse"], ids=_id)
def test_reference_examples_parse(block: tuple[str, int, str, str]) -> None:
    commands = _commands(block[3])
    assert commands, f"{_id(block)}: no stream-dp command in a 'parse' block"
    for argv in commands:
        parser = _parser(argv[0])
        try:
            parser.parse_args(argv)  # type: ignore[attr-defined]
        except SystemExit as exc:
            pytest.fail(f"{_id(block)}: `stream-dp {shlex.join(argv)}` is rejected ({exc})")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[2] == "run"], ids=_id)
def test_runnable_blocks_run_as_written(block: tuple[str, int, str, str],
                                       tmp_path: Path) -> None:
    _run_block(block, tmp_path, tmp_path / "work")


def test_the_quickstart_runs_twice_in_one_folder(tmp_path: Path) -> None:
    """Guide §1's block run a second time, as a new user would (issue #32, failure path 12):
    it exits 0 again and `tail` prints the very same releases (same key, same log, the same
    broker data), instead of a worker refusing the first run's checkpoints, a refused replay
    and the first run's values."""
    block = next(b for b in BLOCKS if b[0] == "docs/guide.md" and b[2] == "run"
                 and "stream-dp replay web.csv" in b[3])
    work = tmp_path / "work"
    first = _run_block(block, tmp_path, work)
    second = _run_block(block, tmp_path, work)
    # tail prints the first 20 messages it fetches (partition order varies): the (tick,
    # stream) pairs both runs printed must carry the very same released values
    rows = [{(m[0], m[1]): m[2] for m in re.findall(r"^\s*(\d+)\s+2024-\S+ \S+\s+(\S+)\s+(\S+)",
                                                  out.stdout, re.M)} for out in (first, second)]
    # (either may be empty on a loaded machine: the block reads "what was released so far")
    common = rows[0].keys() & rows[1].keys()
    assert all(rows[0][k] == rows[1][k] for k in common), (rows, first.stdout[-2000:])
    assert "Nothing to do" in second.stderr, second.stderr[-2000:]


def _run_block(block: tuple[str, int, str, str], tmp_path: Path,
               work: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    bindir = Path(sys.executable).parent
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", HOME=str(tmp_path / "home"),
               XDG_DATA_HOME=str(tmp_path / "xdg"), PYTHONUNBUFFERED="1")
    (tmp_path / "home").mkdir(exist_ok=True)
    if not work.exists():
        work.mkdir()
        (work / "examples").symlink_to(ROOT / "examples")  # docs refer to examples/... paths
    # the block as written uses the default ports (broker 9092, web 6066): run it on free ones
    # so that it never depends on what else runs on the machine
    from agents.kafka.embedded_broker import free_port

    port = free_port()
    text = re.sub(r"stream-dp broker start(?!\S)", f"stream-dp broker start --port {port}",
                  block[3]).replace("127.0.0.1:9092", f"127.0.0.1:{port}")
    env["STREAM_DP_WEB_PORT"] = "0"
    script = "set -euo pipefail\n" + text
    try:
        proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True,
                              text=True, timeout=420)
    finally:  # never leave a development broker behind (default or the block's folder)
        for where in ([], ["--data-dir", str(work / "broker")]):
            subprocess.run([str(bindir / "stream-dp"), "broker", "stop", *where], cwd=work,
                           env=env, capture_output=True, timeout=60)
    logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                   for p in work.glob("*.log"))
    assert proc.returncode == 0, (
        f"{_id(block)} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
        f"stderr:\n{proc.stderr[-3000:]}{logs}")
    return proc
