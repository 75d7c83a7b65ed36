"""The accuracy tables the docs print are what the code computes: every cell, pick and bound.

The tables are the project's headline claims (mean per-release MSE over ticks 1..32767, cap 1,
ε = 1 or ρ = 0.5 per event): the README's and docs/accuracy.md's ("The numbers"). Each is
parsed from its file and every printed figure compared with
:func:`stream_dp.analysis.expected_mse` (the exact analytic error) to the digits it shows, the
bold pick with :func:`stream_dp.planner.pick`, the bound with
:func:`stream_dp.analysis.lower_bound` and the last column, where present, with their ratio.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stream_dp.analysis import expected_mse, lower_bound
from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.planner import pick
from stream_dp.strategies.registry import available

pytestmark = pytest.mark.slow  # every strategy at T = 32767 for up to eleven decays: minutes

ROOT = Path(__file__).resolve().parents[2]
HORIZON = 32767
_MARKS = "¹²³⁴⁵⁶⁷⁸⁹*"


def _tables(path: Path) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table in ``path`` whose first header cell is ``p``: (header, rows)."""
    out: list[tuple[list[str], list[list[str]]]] = []
    block: list[str] = []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in block]
            if cells[0][0] == "p" and len(cells) > 2:
                out.append((cells[0], cells[2:]))
            block = []
    return out


def _clean(cell: str) -> str:
    """A cell without bold and footnote marks: ``**blt**`` → ``blt``, ``762.7¹`` → ``762.7``."""
    return cell.replace("*", "").rstrip(_MARKS).strip()


def _matches(printed: str, value: float) -> bool:
    """``printed`` is ``value`` to the digits it shows (rounded half either way)."""
    digits = printed.split(".")[1] if "." in printed else ""
    return abs(float(printed) - value) <= 0.5 * 10.0 ** -len(digits) * (1 + 1e-9)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


def _check(header: list[str], body: list[list[str]], privacy: Privacy) -> list[str]:
    """The cells of one table that are not what the code computes (empty: all are)."""
    names = [_clean(c) if _clean(c) in ("lower bound", "auto / bound") else _clean(c).split()[0]
             for c in header]
    known = set(available(privacy.model, by_name=True))
    wrong: list[str] = []
    for row in body:
        p = float(row[0])
        bound = lower_bound(p, HORIZON, privacy)
        chosen = pick(p, HORIZON, privacy)
        for name, cell in zip(names[1:], row[1:], strict=True):
            if name in known:
                value = expected_mse(name, p, HORIZON, privacy)
            elif name == "auto":
                match = re.fullmatch(r"\*\*([0-9.]+)\*\* \(([a-z-]+)\)", cell)
                assert match, cell
                if match.group(2) != chosen:
                    wrong.append(f"p={p} auto picks {chosen}, the table {match.group(2)}")
                cell, value = match.group(1), expected_mse(chosen, p, HORIZON, privacy)
            elif name == "lower bound":
                value = bound
            elif name == "auto / bound":
                value = expected_mse(chosen, p, HORIZON, privacy) / bound
            else:
                raise AssertionError(f"unknown column {name!r}")
            if not _matches(_clean(cell), value):
                wrong.append(f"p={p} {name}: printed {cell}, computed {value:.6g}")
    return wrong


@pytest.mark.parametrize(
    ("doc", "index", "privacy"),
    [("README.md", 0, PureDP(1.0)),
     ("docs/accuracy.md", 0, PureDP(1.0)),
     ("docs/accuracy.md", 1, ZCDP(0.5))],
    ids=["readme-pure", "accuracy-pure", "accuracy-zcdp"],
)
def test_every_cell_is_the_exact_error(doc: str, index: int, privacy: Privacy) -> None:
    tables = _tables(ROOT / doc)
    header, body = tables[index]
    assert "lower bound" in header and any(h.startswith("**auto**") for h in header)
    seen = [float(r[0]) for r in body]
    assert seen == sorted(seen) and {0.99, 0.999, 1.0} <= set(seen)
    assert _check(header, body, privacy) == []
