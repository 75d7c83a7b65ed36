"""Unit tests of ``agents.dashboard``."""
