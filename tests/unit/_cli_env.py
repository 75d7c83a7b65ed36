"""A clean environment for command-line tests: no STREAM_DP_* variables, a bootstrap address
where nothing listens (a connection attempt would be a bug: validation comes first), and an
empty working folder. Import ``clean_env`` into a test module to apply it to every test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CLOSED = "127.0.0.1:1"  # nothing listens there: a connection attempt would hang or fail late


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for var in list(os.environ):
        if var.startswith("STREAM_DP_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("STREAM_DP_BOOTSTRAP", CLOSED)
    monkeypatch.chdir(tmp_path)
    yield
