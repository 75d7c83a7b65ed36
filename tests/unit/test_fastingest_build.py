"""Builds of the compiled ingest path (``agents/ingest/csrc/fastingest.c``) other than the installed one,
and the test run's own check that the installed one exists (issue 38).

* The build flags in ``setup.py`` turn a call without a prototype into an error (on Python 3.13
  such a call once compiled into a key hash cut to 32 bits).
* Python 3.14 has no dict version tag: there the key index refuses to be built and the scanner
  looks keys up in the dict. No 3.14 interpreter is needed to test that: ``-DSDP_NO_DICT_VERSION``
  compiles the same branch on this one, and the compiled-vs-pure agreement tests run against it.
* Without the compiled path the test run fails (``tests/conftest.py``) unless
  ``STREAM_DP_TEST_ALLOW_PURE=1`` says no compiler is expected.
"""

from __future__ import annotations

import ast
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ALLOW_PURE_ENV

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "agents" / "ingest" / "csrc"


def _compile_args() -> list[str]:
    """``COMPILE_ARGS`` of setup.py, read without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "COMPILE_ARGS" for t in node.targets):
            args = ast.literal_eval(node.value)
            assert isinstance(args, list)
            return [str(a) for a in args]
    raise AssertionError("setup.py has no COMPILE_ARGS")


def _compiler() -> list[str]:
    cc = shlex.split(str(sysconfig.get_config_var("CC") or "cc"))
    if shutil.which(cc[0]) is None:
        if os.environ.get(ALLOW_PURE_ENV, "") not in ("", "0"):
            pytest.skip(f"no C compiler ({cc[0]}) and {ALLOW_PURE_ENV} set")
        pytest.fail(f"no C compiler ({cc[0]}): set {ALLOW_PURE_ENV}=1 where none is expected")
    return cc


def _build(out_dir: Path, *extra: str) -> Path:
    """The extension compiled as setup.py compiles it (plus ``extra`` flags) into out_dir."""
    out = out_dir / f"_fastingest{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = [*_compiler(), "-shared", "-fPIC", *_compile_args(), *extra,
           f"-I{sysconfig.get_paths()['include']}", f"-I{CSRC}",
           *(str(c) for c in sorted(CSRC.glob("*.c"))), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def test_the_build_flags_reject_a_call_without_a_prototype(tmp_path: Path) -> None:
    """A C file calling an undeclared function does not compile with setup.py's flags (GCC < 14
    would only warn, and assume the function returns ``int``), while the same file with the
    prototype does: the error is the missing declaration, nothing else."""
    body = "long long f(void) { return undeclared_hash(\"k\", 1); }\n"
    proto = "long long undeclared_hash(const char *, long);\n"
    cmd = [*_compiler(), "-c", *_compile_args(), "-o", str(tmp_path / "x.o")]
    for with_proto in (False, True):
        src = tmp_path / "x.c"
        src.write_text((proto if with_proto else "") + body, encoding="utf-8")
        done = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=120)
        if with_proto:
            assert done.returncode == 0, done.stderr
        else:
            assert done.returncode != 0 and "implicit" in done.stderr, done.stderr


# Runs in a child process: loads the given build as agents.ingest._fastingest before anything imports
# the installed one, checks the 3.14 branch is the one compiled, then runs the given tests and
# fails if any test was skipped (a skip would hide that the compiled path is not in use).
_DRIVER = textwrap.dedent("""
    import importlib.util, sys
    path, *args = sys.argv[1:]
    spec = importlib.util.spec_from_file_location("agents.ingest._fastingest", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["agents.ingest._fastingest"] = mod
    import agents.ingest
    agents.ingest._fastingest = mod
    from agents.ingest import processing
    from agents.ingest.routing import Router
    from stream_dp.domain import Domain
    assert processing._fastingest is mod, processing._fastingest
    try:
        mod.KeyIndex({"a": 1})
    except NotImplementedError:
        pass
    else:
        raise SystemExit("the KeyIndex of the no-dict-version build was built")
    assert processing._key_index(Router(Domain.from_paths(["a/x", "b/y"]), 2)) is None
    import pytest

    class Count:
        passed = skipped = 0
        def pytest_runtest_logreport(self, report):
            if report.when == "call" and report.passed:
                Count.passed += 1
            if report.skipped:
                Count.skipped += 1

    rc = pytest.main([*args, "-q", "-p", "no:randomly", "-p", "no:cacheprovider"],
                     plugins=[Count()])
    assert sys.modules["agents.ingest._fastingest"] is mod
    print(f"driver: rc={int(rc)} passed={Count.passed} skipped={Count.skipped}")
    raise SystemExit(int(rc) or (Count.skipped > 0) or (Count.passed == 0))
""")


def test_without_the_dict_version_tag_the_key_index_is_off_and_both_paths_agree(
        tmp_path: Path) -> None:
    """What Python 3.14 gets: ``KeyIndex`` raises NotImplementedError, the worker's
    ``_key_index`` gives None (keys are looked up in the dict), and the compiled and pure paths
    still leave identical state (the property test of test_fastingest.py, on that build)."""
    so = _build(tmp_path, "-DSDP_NO_DICT_VERSION")
    env = {k: v for k, v in os.environ.items() if k not in ("STREAM_DP_PURE_INGEST",
                                                             ALLOW_PURE_ENV)}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(so), "tests/unit/agents/ingest/test_fastingest.py",
         "-k", "identical_state or scanner or many_events", "--basetemp", str(tmp_path / "t")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    assert "driver: rc=0" in done.stdout and " skipped=0" in done.stdout, tail


def test_the_test_run_fails_without_the_compiled_path(tmp_path: Path) -> None:
    """From the outside: a pytest run in which the compiled path is missing (here: switched off
    by ``STREAM_DP_PURE_INGEST=1``, as a failed build leaves it) exits with an error before any
    test, in one line naming the opt-out; with ``STREAM_DP_TEST_ALLOW_PURE=1`` it runs and the
    compiled-path tests are skipped."""
    target = "tests/unit/agents/ingest/test_key_index.py::test_the_slot_tags_are_spread"
    base = {k: v for k, v in os.environ.items() if k != ALLOW_PURE_ENV}
    base["STREAM_DP_PURE_INGEST"] = "1"
    cmd = [sys.executable, "-m", "pytest", target, "-q", "-p", "no:randomly",
           "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t")]
    failed = subprocess.run(cmd, cwd=ROOT, env=base, capture_output=True, text=True,
                            timeout=300)
    assert failed.returncode == pytest.ExitCode.USAGE_ERROR, failed.stdout + failed.stderr
    errors = [ln for ln in failed.stderr.splitlines() if ln.startswith("ERROR:")]
    assert len(errors) == 1 and ALLOW_PURE_ENV in errors[0] and "pure-Python path" in errors[0]
    assert "Traceback" not in failed.stderr
    allowed = subprocess.run(cmd, cwd=ROOT, env={**base, ALLOW_PURE_ENV: "1"},
                             capture_output=True, text=True, timeout=300)
    assert allowed.returncode == 0 and "1 skipped" in allowed.stdout, allowed.stdout
