"""Unit tests of ``agents.telemetry``."""
