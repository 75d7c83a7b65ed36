"""Unit tests of ``agents.worker``."""
