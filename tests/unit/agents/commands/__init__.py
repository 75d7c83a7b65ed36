"""Unit tests of ``agents.commands``."""
