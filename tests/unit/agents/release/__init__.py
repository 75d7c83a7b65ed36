"""Unit tests of ``agents.release``."""
