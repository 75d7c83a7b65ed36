"""The console script keeps BLAS single-threaded unless the user chose otherwise: OpenBLAS's
busy-waiting threads made the worker's plan search 25× slower on a host with busy cores (the demo
released nothing in its first 15 s)."""

from __future__ import annotations

import pytest

from stream_dp import cli


def test_blas_threads_default_to_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in cli.BLAS_THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sys.argv", ["stream-dp", "--help"])
    with pytest.raises(SystemExit):
        cli.main()
    import os

    assert {n: os.environ.get(n) for n in cli.BLAS_THREAD_VARIABLES} == dict.fromkeys(
        cli.BLAS_THREAD_VARIABLES, "1")


def test_a_users_blas_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    cli._single_threaded_blas()
    import os

    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"
