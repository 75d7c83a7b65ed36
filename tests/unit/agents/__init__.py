"""Unit tests of the service, one folder per package of ``agents`` (mirroring the source tree)."""
