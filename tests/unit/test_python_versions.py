"""The supported Python versions, declared once and tested each (issue 38): the versions
``scripts/test`` runs the suites under are the ones pyproject.toml declares, and a missing
interpreter fails the test command loudly instead of being left out."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test"


def _script_supported() -> list[str]:
    found = re.search(r'^SUPPORTED="([^"]*)"', SCRIPT.read_text(encoding="utf-8"), re.M)
    assert found, "scripts/test has no SUPPORTED line"
    return found.group(1).split()


def test_the_test_command_covers_the_declared_versions() -> None:
    """Classifiers, requires-python's lower bound, ruff's and the test command's versions agree,
    and the interpreter running this test is one of them."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    prefix = "Programming Language :: Python :: "
    versions = [c.removeprefix(prefix) for c in meta["project"]["classifiers"]
                if c.startswith(prefix)]
    declared = [v for v in versions if re.fullmatch(r"\d+\.\d+", v)]
    supported = _script_supported()
    assert declared == supported
    assert meta["project"]["requires-python"] == f">={supported[0]}"
    assert meta["tool"]["ruff"]["target-version"] == "py" + supported[0].replace(".", "")
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" in supported


def _pythons(versions: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAM_DP_TEST_PYTHONS": versions,
           # this interpreter's venv first: its bin holds pythonX.Y
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(SCRIPT), "--pythons"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_test_command_finds_this_interpreter() -> None:
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    done = _pythons(here)
    assert done.returncode == 0, done.stderr
    version, path = done.stdout.split()
    assert version == here
    probe = subprocess.run([path, "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == str(sys.version_info[:2])


def test_a_missing_interpreter_fails_the_test_command_in_one_line() -> None:
    """Python 3.99 exists nowhere: the command stops before installing or running anything,
    with one line naming the version and the variable that selects the versions."""
    done = _pythons(f"{sys.version_info[0]}.{sys.version_info[1]} 3.99")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "3.99" in lines[0] and "STREAM_DP_TEST_PYTHONS" in lines[0], lines


def test_outside_ci_a_missing_interpreter_is_named_and_skipped(tmp_path: Path) -> None:
    """A developer without every supported Python runs the README's test command: the missing
    versions are named in one line each and skipped (CI, with ``CI`` set, fails instead). The
    script is run on a PATH without pyenv's interpreters and stopped before it installs
    anything (an unrunnable main interpreter), so only the look-up is exercised."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(tmp_path),
           "PYENV_ROOT": str(tmp_path / "no-pyenv"), "PYTHON": sys.executable}
    done = subprocess.run([str(SCRIPT), "--pythons-plan"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = [x for x in done.stderr.splitlines() if "no Python" in x]
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    # the system's own interpreters (/usr/bin/python3.X) may still be found on that PATH
    missing = [v for v in _script_supported() if v != here
               and shutil.which(f"python{v}", path=env["PATH"]) is None]
    assert missing, "every supported Python is in /usr/bin: nothing to test here"
    assert done.returncode == 0, done.stderr
    assert [v for v in _script_supported()
            if any(f"no Python {v} found" in x for x in lines)] == missing
    assert all("not run here" in x for x in lines)
    in_ci = subprocess.run([str(SCRIPT), "--pythons-plan"], cwd=ROOT, env={**env, "CI": "true"},
                           capture_output=True, text=True, timeout=120)
    assert in_ci.returncode == 1 and "STREAM_DP_TEST_PYTHONS" in in_ci.stderr
