"""``python -m agents.config``: regenerate ``docs/configuration.md`` from the settings."""

from __future__ import annotations

from pathlib import Path

from agents.config.docs import configuration_markdown

Path("docs/configuration.md").write_text(configuration_markdown(), encoding="utf-8")
