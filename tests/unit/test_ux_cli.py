"""Rough edges a new user hit (issue 32, items 7-11 and 13), run the way a user runs them: a
``stream-dp`` subprocess, its exit status and its output."""

from __future__ import annotations

from importlib.metadata import version

from tests.unit.test_operations_cli import run_cli


def test_version_prints_the_installed_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"stream-dp {version('stream-dp')}"
    assert not proc.stderr
