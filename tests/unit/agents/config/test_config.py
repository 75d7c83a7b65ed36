"""Settings: precedence, validation, secrets kept out of repr, generated docs current."""

from __future__ import annotations

from pathlib import Path

import pytest

import agents.config as config
from agents.config.docs import configuration_markdown, settings_table
from agents.config.domain import load_domain
from agents.config.settings import Settings

ROOT = Path(__file__).resolve().parents[4]


def test_defaults_need_origin() -> None:
    with pytest.raises(ValueError, match="origin"):
        Settings.load(env={})
    s = Settings.load(env={"STREAM_DP_ORIGIN": "1000"})
    assert s.origin == 1000.0 and s.strategy == "auto" and s.web_host == "127.0.0.1"


def test_precedence_toml_then_env(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(
        'origin = 5.0\ntick_seconds = 30\ndomain_file = "d.toml"\nshards = 3\n', encoding="utf-8"
    )
    s = Settings.load(tmp_path / "s.toml", env={"STREAM_DP_SHARDS": "4"})
    assert s.tick_seconds == 30.0 and s.shards == 4 and s.origin == 5.0
    assert s.domain_file == str(tmp_path / "d.toml")
    s2 = Settings.load(env={"STREAM_DP_CONFIG": str(tmp_path / "s.toml")})
    assert s2.shards == 3


def test_unknown_toml_key_and_bad_values_name_the_setting(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text("origin = 1.0\ntick_secs = 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="tick_secs"):
        Settings.load(tmp_path / "s.toml", env={})
    base = {"STREAM_DP_ORIGIN": "1"}
    for var, value, name in [
        ("STREAM_DP_P", "1.5", "p"),
        ("STREAM_DP_P", "nan", "p"),
        ("STREAM_DP_SHARDS", "0", "shards"),
        ("STREAM_DP_SHARDS", "two", "shards"),
        ("STREAM_DP_TICK_SECONDS", "-1", "tick_seconds"),
        ("STREAM_DP_EPSILON", "inf", "epsilon"),
        ("STREAM_DP_STRATEGY", "magic", "strategy"),
        ("STREAM_DP_PRIVACY_MODEL", "approx", "privacy_model"),
        ("STREAM_DP_WEB_PORT", "70000", "web_port"),
    ]:
        with pytest.raises(ValueError, match=name):
            Settings.load(env={**base, var: value})


def test_secret_never_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "correct-horse-battery-staple-123"
    monkeypatch.setenv("STREAM_DP_KEY", secret)
    s = Settings.load(env={"STREAM_DP_ORIGIN": "1", "STREAM_DP_KEY": secret})
    assert secret not in repr(s) and secret not in str(s)
    assert not hasattr(s, "key")


def test_privacy_and_tick_bounds() -> None:
    s = Settings.load(env={"STREAM_DP_ORIGIN": "100", "STREAM_DP_TICK_SECONDS": "10"})
    assert s.tick_bounds(1) == (100.0, 110.0) and s.tick_bounds(3) == (120.0, 130.0)
    assert s.privacy.as_dict() == {"model": "pure", "epsilon": 1.0}
    z = s.replace(privacy_model="zcdp", rho=0.25)
    assert z.privacy.as_dict() == {"model": "zcdp", "rho": 0.25}


def test_docstring_table_and_docs_file_are_current() -> None:
    table = settings_table()
    assert config.__doc__ is not None and table in config.__doc__
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert doc == configuration_markdown(), "run: python -m agents.config"
    for name in Settings.__dataclass_fields__:
        assert f"`STREAM_DP_{name.upper()}`" in table


def test_example_files_parse() -> None:
    s = Settings.load(ROOT / "examples" / "stream-dp.toml", env={})
    assert Path(s.domain_file) == ROOT / "examples" / "domain.toml"
    dom = load_domain(s.domain_file)
    assert dom.kind == "hierarchy" and dom.size == 7 + 2 + 4 + 1
    assert list(dom.nodes_for_event("eu/fr/paris")) == [
        dom.index("eu/fr/paris"), dom.index("eu/fr"), dom.index("eu"), dom.index("all")
    ]
    grid = load_domain(ROOT / "examples" / "domain-grid.toml")
    assert grid.kind == "grid" and grid.size == 1 + 7 + 12


def test_internal_topics_follow_the_app_id_unless_named() -> None:
    base = Settings(origin=1.0)
    assert (base.partials_topic, base.ingest_checkpoints_topic, base.release_checkpoints_topic,
            base.schedule_topic, base.leader_topic) == (
        "dp.partials.v1", "dp.checkpoints.ingest.v1", "dp.checkpoints.release.v1",
        "dp.schedule.v1", "dp.reconcile.leader")
    other = base.replace(app_id="shop-v2")
    assert other.partials_topic == "shop-v2.partials.v1"
    assert other.ingest_checkpoints_topic == "shop-v2.checkpoints.ingest.v1"
    assert other.release_checkpoints_topic == "shop-v2.checkpoints.release.v1"
    assert other.schedule_topic == "shop-v2.schedule.v1"
    assert other.leader_topic == "shop-v2.reconcile.leader"
    named = Settings(origin=1.0, app_id="x", partials_topic="mine")
    assert named.partials_topic == "mine" and named.replace(app_id="y").partials_topic == "mine"
    env = Settings.load(env={"STREAM_DP_ORIGIN": "1", "STREAM_DP_APP_ID": "z"})
    assert env.schedule_topic == "z.schedule.v1"
    # the user-facing topics keep their contract names
    assert other.counts_topic == "dp.counts.v1" and other.events_topic == "dp.events.v1"
