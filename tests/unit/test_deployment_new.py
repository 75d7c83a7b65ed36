"""`stream-dp deployment new` from the outside (issue #32, failure path 3): the one command that
starts a new deployment prints its app id, topics, key file and the budget note, and writes a
settings file that a worker loads as a different deployment with the changed setting."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from agents.config.deployment import BINDING
from agents.config.settings import Settings
from tests.unit.test_operations_cli import _env, assert_one_line, run_cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def prod(tmp_path: Path) -> Path:
    toml = tmp_path / "prod.toml"
    toml.write_text(f'app_id = "shop"\ndomain_file = "{ROOT / "examples" / "domain.toml"}"\n'
                    'origin = 1700000000\nepsilon = 1.0\np = 0.9\ncounts_topic = "shop.counts"\n')
    return toml


def test_new_deployment_prints_and_writes_everything(prod: Path, tmp_path: Path) -> None:
    proc = run_cli("deployment", "new", "--config", str(prod), "--set", "epsilon=0.5",
                   "--app-id", "shop-2", "--no-topics", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    new_toml, key = tmp_path / "shop-2.toml", tmp_path / "shop-2.noise.key"
    for needle in ("new deployment  shop-2  (from shop)", f"settings file   {new_toml}",
                   f"noise key file  {key}", "shop-2.counts.v1", "shop-2.schedule.v1",
                   "budget          a new budget (epsilon = 0.5", "pay in both",
                   f"STREAM_DP_CONFIG={new_toml} stream-dp worker"):
        assert needle in out, out
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    old = Settings.load(prod, env={})
    new = Settings.load(new_toml, env={})
    assert len(new.noise_key()) == 32
    assert new.app_id == "shop-2" and new.epsilon == 0.5 and new.counts_topic == "shop-2.counts.v1"
    assert new.schedule_topic == "shop-2.schedule.v1" and new.events_topic == old.events_topic
    # every other bound setting carries over (origin: the next tick on the clock schedule)
    same = {n for n in BINDING} - {"app_id", "epsilon", "origin", "schedule_topic"}
    assert {n: getattr(new, n) for n in same} == {n: getattr(old, n) for n in same}
    assert new.origin > old.origin and new.origin % new.tick_seconds == 0
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert "worker_id" in fields and "worker_id" not in new_toml.read_text()


def test_files_are_never_overwritten(prod: Path, tmp_path: Path) -> None:
    args = ("deployment", "new", "--config", str(prod), "--app-id", "shop-2", "--no-topics")
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    key = (tmp_path / "shop-2.noise.key").read_bytes()
    again = run_cli(*args, cwd=tmp_path)
    assert_one_line(again, 2, "exists already")
    assert (tmp_path / "shop-2.noise.key").read_bytes() == key


@pytest.mark.parametrize(("argv", "needle"), [
    (["--set", "epsilom=0.5"], "unknown setting 'epsilom' (did you mean epsilon?)"),
    (["--set", "epsilon"], "--set takes NAME=VALUE"),
    (["--set", "epsilon=-1"], "epsilon"),
    (["--app-id", "shop"], "is the current deployment's"),
])
def test_bad_usage_is_one_line(prod: Path, tmp_path: Path, argv: list[str], needle: str) -> None:
    proc = run_cli("deployment", "new", "--config", str(prod), "--no-topics", *argv,
                   cwd=tmp_path)
    assert_one_line(proc, 2, needle)
    assert not list(tmp_path.glob("*.key"))


def test_an_overriding_variable_is_named(prod: Path, tmp_path: Path) -> None:
    proc = run_cli("deployment", "new", "--config", str(prod), "--no-topics", "--set", "p=0.95",
                   env=_env(STREAM_DP_P="0.9"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "unset STREAM_DP_P" in proc.stderr
