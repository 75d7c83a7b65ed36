"""The settings of the person as unit of privacy (``privacy_unit``, ``user_*``; issue #34):
loading, one-line validation (also from the outside: ``stream-dp worker``, exit status 2), and
their binding — part of the deployment's identity with ``privacy_unit = user`` only, so an
event-level deployment's identity, nonce and settings record are what they were; a change of
the unit or of any bound is refused naming the setting."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agents.config.deployment import BINDING, USER_BINDING, deployment_context, deployment_id
from agents.config.domain import check_attribute_settings
from agents.config.settings import USER_SETTINGS, Settings
from agents.kafka.deployment_settings import (
    differences,
    parse_settings_record,
    settings_record,
)
from stream_dp.attributes import BinaryDomain
from tests.unit.test_operations_cli import GOOD_DOMAIN, _worker_env, assert_one_line, run_cli

KEY = bytes(range(32))
DIGEST = "d" * 64
USER = dict(privacy_unit="user", user_period_ticks=1440, user_max_events=10)


def _s(**kw: Any) -> Settings:
    return Settings(origin=1000.0, **kw)


def test_defaults_are_event_level_and_every_variable_loads() -> None:
    s = _s()
    assert (s.privacy_unit, s.user_field, s.user_max_streams) == ("event", "user", 0)
    env = {"STREAM_DP_ORIGIN": "1000", "STREAM_DP_PRIVACY_UNIT": "user",
           "STREAM_DP_USER_FIELD": "device", "STREAM_DP_USER_PERIOD_TICKS": "0",
           "STREAM_DP_USER_MAX_EVENTS": "7", "STREAM_DP_USER_MAX_STREAMS": "3",
           "STREAM_DP_USER_MAX_EVENTS_PER_STREAM": "2",
           "STREAM_DP_USER_MIN_SEPARATION_TICKS": "5"}
    u = Settings.load(env=env)
    assert (u.privacy_unit, u.user_field, u.user_period_ticks, u.user_max_events,
            u.user_max_streams, u.user_max_events_per_stream,
            u.user_min_separation_ticks) == ("user", "device", 0, 7, 3, 2, 5)
    assert set(USER_SETTINGS) == set(USER_BINDING)


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(privacy_unit="person"), "privacy_unit must be 'event' or 'user'"),
    (dict(privacy_unit="user"), "privacy_unit = user needs user_period_ticks"),
    (dict(privacy_unit="user", user_period_ticks=60), "needs user_max_events >= 1"),
    ({**USER, "user_max_events": -1}, "user_max_events must be an integer"),
    ({**USER, "user_period_ticks": -2}, "user_period_ticks must be an integer in [0,"),
    ({**USER, "user_max_streams": 1 << 32}, "user_max_streams must be an integer"),
    ({**USER, "user_max_events_per_stream": -1}, "user_max_events_per_stream must be"),
    ({**USER, "user_min_separation_ticks": True}, "user_min_separation_ticks must be"),
    ({**USER, "user_field": ""}, "user_field must be the name of an event field"),
    ({**USER, "user_field": "key"}, "must not be one of the event's own fields"),
    (dict(user_max_events=5), "user_max_events = 5 needs privacy_unit = user"),
    (dict(user_field="device"), "user_field = 'device' needs privacy_unit = user"),
    (dict(user_period_ticks=60), "user_period_ticks = 60 needs privacy_unit = user"),
])
def test_bad_values_are_one_line_errors(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError) as got:
        _s(**kw)
    assert needle in str(got.value) and "\n" not in str(got.value)


def test_the_worker_refuses_bad_user_settings_in_one_line(tmp_path: Any) -> None:
    proc = run_cli("worker", env=_worker_env(tmp_path, GOOD_DOMAIN,
                                             STREAM_DP_PRIVACY_UNIT="user",
                                             STREAM_DP_USER_PERIOD_TICKS="60"))
    assert_one_line(proc, 2, "privacy_unit = user needs user_max_events >= 1")


def test_binary_attribute_domains_take_the_user_unit() -> None:
    """Refused before the tables bounded persons; now the other rules still hold."""
    domain = BinaryDomain(["a", "b"])
    s = _s(**USER, shards=1, strategy="naive")
    check_attribute_settings(s, domain)
    with pytest.raises(ValueError, match="shards = 1"):
        check_attribute_settings(s.replace(shards=2), domain)


# ------------------------------------------------------------------ binding
def test_event_level_identity_is_unchanged() -> None:
    """The identity of an event-level deployment holds exactly the settings it held before
    the person existed as a unit: its noise, checkpoints and published bytes do not move."""
    s = _s()
    ctx = deployment_context(s, DIGEST, "ab" * 32)
    assert set(ctx) == {"context", "version", "domain", "nonce", *BINDING}
    # no user setting can move it (they cannot even be set without privacy_unit = user)
    for name in USER_BINDING:
        assert name not in ctx


@pytest.mark.parametrize("name", USER_BINDING)
def test_every_user_setting_is_bound_into_a_user_level_identity(name: str) -> None:
    s = _s(**USER, user_max_streams=2, user_max_events_per_stream=3,
           user_min_separation_ticks=1)
    if name == "privacy_unit":
        other = _s()  # back to event level (the bounds must go with it)
    elif name == "user_field":
        other = s.replace(user_field="device")
    else:
        other = s.replace(**{name: getattr(s, name) + 1})
    assert deployment_id(s, DIGEST) != deployment_id(other, DIGEST)
    assert deployment_id(s, DIGEST) != deployment_id(_s(), DIGEST)


def _stored(s: Settings) -> dict[str, Any]:
    got = parse_settings_record(s, KEY, settings_record(s, DIGEST, KEY))
    assert got is not None
    return got


def test_the_settings_record_refuses_a_changed_unit_or_bound_naming_it() -> None:
    event, user = _s(), _s(**USER)
    assert "privacy_unit" not in _stored(event)["settings"]  # event-level record as before
    assert differences(_stored(event), event, DIGEST) == []
    assert differences(_stored(user), user, DIGEST) == []
    assert differences(_stored(event), user, DIGEST) == [
        "privacy_unit: 'event' (stored) vs 'user' (configured)"]
    back = differences(_stored(user), event, DIGEST)
    assert back[0] == "privacy_unit: 'user' (stored) vs 'event' (configured)"
    assert "user_max_events: 10 (stored) vs 0 (configured)" in back
    assert differences(_stored(user), user.replace(user_max_events=11), DIGEST) == [
        "user_max_events: 10 (stored) vs 11 (configured)"]
    assert differences(_stored(user), user.replace(user_period_ticks=60), DIGEST) == [
        "user_period_ticks: 1440 (stored) vs 60 (configured)"]


def test_every_setting_is_documented_with_its_variable() -> None:
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    for name in USER_SETTINGS:
        assert fields[name].metadata["doc"]
