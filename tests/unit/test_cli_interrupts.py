"""Ctrl-C and unwritable disks, for every command, from the outside (issue #32, failure path 4):
a real ``stream-dp`` process, its exit status and its one line on stderr, never a traceback.

Ctrl-C that lands before a command finished its work exits 130 with ``stream-dp CMD:
interrupted`` (also while modules are still being imported); a file that cannot be written
(read-only place, full disk) is one line naming the path, exit status 1; an interrupted
``simulate --out`` leaves no file that looks complete."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_operations_cli import CLI, _env, assert_one_line, run_cli


def _interrupt(argv: list[str], cwd: Path, *, after: float = 0.0, when: str | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``stream-dp argv``; SIGINT it ``after`` s, or once ``when`` appears on its output."""
    out_path = cwd / "_out.txt"
    with open(out_path, "w") as out:
        proc = subprocess.Popen([*CLI, *argv], stdout=out, stderr=subprocess.PIPE, text=True,
                                env=_env(), cwd=cwd)
    try:
        deadline = time.monotonic() + timeout
        if when is not None:
            while when not in out_path.read_text():
                assert proc.poll() is None, (proc.returncode, out_path.read_text()[-2000:])
                assert time.monotonic() < deadline, out_path.read_text()[-2000:]
                time.sleep(0.05)
        time.sleep(after)
        assert proc.poll() is None, "finished before the interrupt: make the work longer"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out_path.read_text(), err)


@pytest.mark.parametrize("after", [0.3, 3.0])
def test_ctrl_c_during_a_long_plan_is_one_line_and_130(tmp_path: Path, after: float) -> None:
    """0.3 s: still importing NumPy and the strategies; 3 s: inside the error curves."""
    proc = _interrupt(["plan", "--p", "0.99", "--epsilon", "1", "--horizon", "1048575"],
                      tmp_path, after=after)
    assert_one_line(proc, 130, "stream-dp plan: interrupted")


def test_ctrl_c_during_simulate_out_leaves_no_truncated_log(tmp_path: Path) -> None:
    """The log is written under a temporary name and renamed only when complete: an
    interrupted run leaves neither a truncated ``web.csv`` nor the temporary file."""
    proc = _interrupt(["simulate", "worldcup98", "--out", "web.csv"], tmp_path, after=1.5)
    assert_one_line(proc, 130, "stream-dp simulate: interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_out.txt"]


def test_simulate_out_is_complete_and_replaces_the_old_file(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("old\n")
    proc = run_cli("simulate", "restaurant", "--ticks", "3", "--out", "r.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert lines[0] != "old" and len(lines) > 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv"]
    assert os.stat(tmp_path / "r.csv").st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_ctrl_c_during_the_demos_start_is_one_line_130_and_leaves_nothing(tmp_path: Path) -> None:
    """Interrupted while the broker starts: 130, one line, the broker stopped."""
    data = tmp_path / "demo"
    proc = _interrupt(["demo", "--data-dir", str(data)], tmp_path,
                      when="starting the embedded broker")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines and lines[0].startswith("stream-dp demo: interrupted"), proc.stderr
    assert all("interrupted" in line or "please wait" in line for line in lines), proc.stderr
    from tests.integration.test_demo import processes_mentioning

    deadline = time.monotonic() + 30
    while processes_mentioning(str(data)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(data)) == []


@pytest.fixture()
def unwritable() -> Iterator[Path]:
    """A directory in which nothing can be created: mode 0500, or (for root, whom modes do not
    stop) a folder of the read-only sysfs."""
    if os.geteuid() != 0:
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o500)
            yield Path(tmp)
            os.chmod(tmp, 0o700)
        return
    if not os.path.isdir("/sys/kernel") or _can_create("/sys"):
        pytest.skip("no read-only folder available for root")
    yield Path("/sys")


def _can_create(folder: str) -> bool:
    try:
        os.mkdir(os.path.join(folder, "stream-dp-probe"))
    except OSError:
        return False
    os.rmdir(os.path.join(folder, "stream-dp-probe"))
    return True


@pytest.mark.parametrize("argv", [
    ["broker", "start", "--data-dir", "{dir}/broker"],
    ["demo", "--data-dir", "{dir}/demo", "--duration", "5"],
    ["simulate", "restaurant", "--ticks", "3", "--out", "{dir}/r.csv"],
    ["simulate", "restaurant", "--ticks", "3", "--domain-out", "{dir}/d.toml"],
    ["simulate", "attributes", "--ticks", "3", "--out", "{dir}/a.jsonl"],
])
def test_a_read_only_place_is_one_line(argv: list[str], unwritable: Path, tmp_path: Path) -> None:
    args = [a.format(dir=unwritable) for a in argv]
    proc = run_cli(*args, cwd=tmp_path)
    target = next(a for a in args if a.startswith(str(unwritable)))
    assert_one_line(proc, 1, "cannot write", repr(target), "writable place")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [
    ["simulate", "restaurant", "--ticks", "30", "--out", "/dev/full", "--format", "csv"],
    ["simulate", "attributes", "--ticks", "3", "--out", "/dev/full", "--format", "jsonl"],
])
def test_a_full_disk_is_one_line(argv: list[str], tmp_path: Path) -> None:
    proc = run_cli(*argv, cwd=tmp_path)
    assert_one_line(proc, 1, "cannot write '/dev/full'", "No space left", "free some space")


def test_simulate_format_it_cannot_tell_is_bad_usage(tmp_path: Path) -> None:
    proc = run_cli("simulate", "restaurant", "--out", "events.log", cwd=tmp_path)
    assert_one_line(proc, 2, "cannot tell the format", "--format")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_stopped_during_start_up_exits_0_in_one_line(
        tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM while the worker still connects (a broker that accepts and never answers): a stop
    like any other, exit 0 with one line — it used to die of the signal (status -15) when the
    signal came before the worker's own handler was installed (guide §1 run again)."""
    import socket

    from tests.unit.test_operations_cli import KEY

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    domain = tmp_path / "domain.toml"
    domain.write_text('name = "d"\nkind = "flat"\nstreams = ["a", "b"]\n')
    env = _env(STREAM_DP_BOOTSTRAP=f"127.0.0.1:{silent.getsockname()[1]}", STREAM_DP_KEY=KEY,
               STREAM_DP_ORIGIN="0", STREAM_DP_DOMAIN_FILE=str(domain),
               STREAM_DP_SCHEDULE="markers")
    try:
        proc = subprocess.Popen([*CLI, "worker"], env=env, cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not _connected(silent) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        silent.close()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    assert lines == ["stream-dp worker: stopped by a signal before it started"], err[-3000:]


def _connected(server: object) -> bool:
    """True once a client connected to the listening ``server`` socket (waits up to 0.2 s)."""
    import select
    import socket

    assert isinstance(server, socket.socket)
    ready, _, _ = select.select([server], [], [], 0.2)
    if ready:
        conn, _ = server.accept()
        _KEEP.append(conn)  # keep it open and silent
        return True
    return False


_KEEP: list[object] = []


def test_an_import_interrupted_inside_an_extension_counts_as_interrupted() -> None:
    """SciPy's pybind11 extensions turn a KeyboardInterrupt during their initialisation into
    ``ImportError("initialization failed")`` raised from it (CI, Python 3.13, SIGINT at 0.3 s:
    exit status 1 and a traceback instead of 130 and one line). The CLI follows the chain; an
    ImportError of its own is still one."""
    from stream_dp.cli import _interrupted_import

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as k:
            raise ImportError("initialization failed") from k
    except ImportError as exc:
        assert _interrupted_import(exc)
    assert not _interrupted_import(ImportError("cannot import name 'x'"))
    assert not _interrupted_import(ModuleNotFoundError("no module named 'aiokafka'"))
