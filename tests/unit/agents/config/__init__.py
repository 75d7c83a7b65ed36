"""Unit tests of ``agents.config``."""
