"""A worker moved to a machine of another CPU type opens its deployment's checkpoints.

``blt``'s fit for a ``(p, horizon)`` the package does not ship is made on the host, through its
BLAS; another CPU's kernels can land on another optimum, and so on another mechanism, noise key
and checkpoint seal — the worker was refused (exit status 4). The first worker now records its
fits in the deployment's nonce record and every worker pins them. Two real ``stream-dp worker``
processes here, the second under another of OpenBLAS's kernels (``OPENBLAS_CORETYPE``) and with
an empty fit cache, as on a new machine.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import pytest

from tests.integration.test_commands_service import _worker_env, cli
from tests.integration.test_deployment_settings import _first_run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                       reason="OpenBLAS core types named here are x86-64 ones"),
]


def _run(env: dict[str, str], log_path: Path) -> str:
    """A worker runs until it has started and released for a few seconds (restored state, for
    the second), then stops with exit status 0; its log. The fit may take a minute on a busy
    machine."""
    return _first_run(env, log_path, settle=4.0, start_within=300.0)


def test_a_worker_on_another_cpu_type_opens_the_checkpoints(
    kafka_broker: str, tmp_path: Path
) -> None:
    env = _worker_env(tmp_path, kafka_broker, f"fits{time.monotonic_ns()}", 0)
    env.update({"STREAM_DP_PRIVACY_MODEL": "zcdp", "STREAM_DP_RHO": "0.5",
                "STREAM_DP_STRATEGY": "blt", "STREAM_DP_P": "0.95",
                "STREAM_DP_HORIZON": "4095", "OPENBLAS_NUM_THREADS": "1"})
    assert cli("topics", "create", env=env).returncode == 0
    first = _run({**env, "OPENBLAS_CORETYPE": "Haswell",
                  "STREAM_DP_CACHE_DIR": str(tmp_path / "cache-a")}, tmp_path / "a.log")
    assert "recorded" not in first
    fits = list((tmp_path / "cache-a").glob("blt-fit-*0x1.e666666666666p-1-n4095.json"))
    assert fits, "the first worker made its own fit (none is shipped for p = 0.95, 4095)"

    second = _run({**env, "OPENBLAS_CORETYPE": "Prescott",
                   "STREAM_DP_CACHE_DIR": str(tmp_path / "cache-b")}, tmp_path / "b.log")
    assert "refusing" not in second, second[-3000:]
    other = (tmp_path / "cache-b" / fits[0].name).read_text()
    if other != fits[0].read_text():  # this CPU's kernels do land elsewhere: the pin was used
        assert "differs from the one the deployment recorded" in second, second[-3000:]
