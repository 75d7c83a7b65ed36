"""``stream-dp plan``: one row per registered strategy, ratio to the best, the planner's pick."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.cli import main
from stream_dp.planner import pick
from stream_dp.strategies.registry import available


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--p", "0.999", "--epsilon", "1", "--horizon", "4095"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    names = available("pure")
    body = [ln for ln in lines if ln.split() and ln.split()[0] in names]
    assert sorted(ln.split()[0] for ln in body) == sorted(names)
    ratios = [float(ln.split()[4]) for ln in body]
    assert ratios[0] == 1.0 and ratios == sorted(ratios)
    chosen = pick(0.999, 4095, PureDP(1.0))
    assert f"pick: {chosen}" in lines
    assert body[0].split()[0] == chosen and body[0].endswith("<- pick")


def test_json_matches_analysis(capsys: pytest.CaptureFixture[str]) -> None:
    from stream_dp.analysis import expected_mse

    assert (
        main(
            [
                "plan",
                "--p",
                "0.9",
                "--epsilon",
                "0.5",
                "--horizon",
                "255",
                "--cap",
                "2",
                "--format",
                "json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["privacy"] == {"model": "pure", "epsilon": 0.5}
    for row in doc["strategies"]:
        assert row["mse"] == pytest.approx(
            expected_mse(row["strategy"], 0.9, 255, 0.5, cap=2.0), rel=1e-12
        )
        assert row["rmse"] ** 2 == pytest.approx(row["mse"], rel=1e-12)
    assert doc["pick"] == doc["strategies"][0]["strategy"]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--p", "1.5", "--epsilon", "1", "--horizon", "7"], "p must"),
        (["--p", "0.5", "--epsilon", "0", "--horizon", "7"], "epsilon"),
        (["--p", "0.5", "--epsilon", "1", "--horizon", "0"], "horizon"),
        (["--p", "0.5", "--epsilon", "1", "--horizon", "7", "--cap", "-1"], "cap"),
    ],
)
def test_bad_input_exit_2(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *argv]) == 2
    assert match in capsys.readouterr().err


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "stream-dp plan --p 0.9 --epsilon 1 --horizon 32767" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "privacy"),
    [(["--epsilon", "1"], PureDP(1.0)), (["--privacy", "zcdp", "--rho", "0.5"], ZCDP(0.5))],
)
def test_every_row_shows_its_ratio_to_the_lower_bound(
    flags: list[str], privacy: Privacy, capsys: pytest.CaptureFixture[str]
) -> None:
    from stream_dp.analysis import expected_mse, lower_bound

    argv = ["plan", "--p", "0.99", "--horizon", "1023", *flags]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    bound = lower_bound(0.99, 1023, privacy)
    assert doc["lower_bound"]["mse"] == pytest.approx(bound, rel=1e-12)
    assert {r["strategy"] for r in doc["strategies"]} == set(available(privacy.model))
    for r in doc["strategies"]:
        mse = expected_mse(r["strategy"], 0.99, 1023, privacy)
        assert r["bound_ratio"] == pytest.approx(mse / bound, rel=1e-9)
        assert r["bound_ratio"] >= 1.0  # no real-valued strategy beats the bound
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "x bound" in lines[1]
    col = lines[1].split().index("bound") - 1  # "x bound" is two words in the header
    for r in doc["strategies"]:
        row = next(ln.split() for ln in lines if ln.split()[:1] == [r["strategy"]])
        assert float(row[col].rstrip("*")) == pytest.approx(r["bound_ratio"], rel=2e-3)
    # the legend names the norm the noise is calibrated to: L1 for Laplace, L2 for Gaussian
    legend = next(ln for ln in lines if ln.strip().startswith("sensitivity "))
    norm, other = ("L2", "L1") if isinstance(privacy, ZCDP) else ("L1", "L2")
    assert f"{norm} sensitivity" in legend and other not in legend


def test_accuracy_doc_examples_run() -> None:
    """The Python example in docs/accuracy.md (expected_mse with a zCDP budget) is a doctest."""
    import doctest

    doc = Path(__file__).resolve().parents[2] / "docs" / "accuracy.md"
    result = doctest.testfile(str(doc), module_relative=False)
    assert result.attempted >= 4 and result.failed == 0
