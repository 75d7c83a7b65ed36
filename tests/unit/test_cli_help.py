"""Every `stream-dp` command has --help with an Examples section, and the user guide covers it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agents.cli import COMMANDS, main

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_has_examples_that_use_the_command(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: stream-dp {command}")
    heading = re.search(r"^examples:\s*$", out, re.I | re.M)
    assert heading, f"stream-dp {command} --help has no 'Examples' section"
    examples = out[heading.end():].split("\n\n")[0]
    assert re.search(rf"stream-dp {command}\b", examples), examples


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_guide_documents_every_command_with_an_example(command: str) -> None:
    text = GUIDE.read_text(encoding="utf-8")
    section = re.search(rf"^### stream-dp {command}\n(.*?)(?=^#|\Z)", text, re.M | re.S)
    assert section, f"docs/guide.md has no section for stream-dp {command}"
    assert re.search(rf"```bash\n(.*\n)*?.*stream-dp {command}\b", section.group(1))


def test_guide_covers_the_concepts() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    for heading in ("Quickstart", "Ticks", "Decay", "What ε protects", "Contribution cap",
                    "Replay semantics", "Consistency", "Scaling out", "Operations"):
        assert re.search(rf"^#+ .*{re.escape(heading)}", text, re.M), heading
    for doc in re.findall(r"\]\(([a-zA-Z]+\.md)(?:#[^)]*)?\)", text):
        assert (GUIDE.parent / doc).exists(), doc
