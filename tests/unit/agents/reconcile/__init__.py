"""Unit tests of ``agents.reconcile``."""
