"""Unit tests of ``agents.kafka``."""
