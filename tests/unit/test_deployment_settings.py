"""The deployment-settings record (agents.kafka.deployment_settings, issue #32 failure path 2): only an
authentic record decides (DESIGN rule 7), and the refusal names each changed setting with both
values — the end-to-end test is tests/integration/test_deployment_settings.py."""

from __future__ import annotations

from typing import Any

from agents.config.settings import Settings
from agents.kafka.deployment_settings import differences, parse_settings_record, settings_record

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))


def _settings(**kw: Any) -> Settings:
    base: dict[str, Any] = {"origin": 1_700_000_000.0, "app_id": "shop",
                            "domain_file": "examples/domain.toml"}
    base.update(kw)
    return Settings(**base)


def test_only_an_authentic_record_is_read() -> None:
    s = _settings()
    record = settings_record(s, "d" * 64, KEY)
    assert parse_settings_record(s, KEY, record) is not None
    assert parse_settings_record(s, OTHER, record) is None  # another key
    assert parse_settings_record(_settings(app_id="other"), KEY, record) is None  # elsewhere
    for i in range(0, len(record), max(1, len(record) // 40)):  # any changed byte
        forged = record[:i] + bytes([record[i] ^ 1]) + record[i + 1:]
        assert parse_settings_record(s, KEY, forged) is None
    assert parse_settings_record(s, KEY, None) is None


def test_differences_name_each_setting_with_both_values() -> None:
    stored = parse_settings_record(_settings(), KEY, settings_record(_settings(), "d" * 64, KEY))
    assert stored is not None
    assert differences(stored, _settings(), "d" * 64) == []
    assert differences(stored, _settings(epsilon=2.0, p=0.9), "d" * 64) == [
        "p: 0.95 (stored) vs 0.9 (configured)", "epsilon: 1 (stored) vs 2 (configured)"]
    default = Settings.__dataclass_fields__["strategy"].default
    assert differences(stored, _settings(strategy="naive"), "d" * 64) == [
        f"strategy: {default!r} (stored) vs 'naive' (configured)"]
    # exact: a float that differs in its last bit is another setting
    assert differences(stored, _settings(epsilon=1.0000000000000002), "d" * 64) == [
        "epsilon: 1 (stored) vs 1.0000000000000002 (configured)"]
    assert differences(stored, _settings(), "e" * 64) == [
        "the domain file's content: digest dddddddddddd (stored) vs eeeeeeeeeeee (configured)"]
    # the events topic is the schedule's own question (exit status 3)
    assert differences(stored, _settings(events_topic="other"), "d" * 64) == []
