"""Unit tests of ``agents.ingest``."""
