"""How ``stream-dp tail`` prints what it reads: count rows, histograms, binary-attribute tables,
query answers and dead letters (one line or block per message; no Kafka here).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from stream_dp.user_level.rounding import format_up


def _iso(ts: Any) -> str:
    try:
        return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError):
        return "?"


def privacy_text(privacy: Any) -> str:
    """``ε=1`` or ``ρ=0.5`` (per event) from the message's privacy object; a user-level
    record's adds what it means for one person: ``ε=1 · ε=10 per person per period``."""
    if not isinstance(privacy, dict):
        return "?"
    model = privacy.get("model")
    if model not in ("pure", "zcdp"):
        return "?"
    sym, key = ("ε", "epsilon") if model == "pure" else ("ρ", "rho")
    text = f"{sym}={_g(privacy.get(key))}"
    person = privacy.get("per_person")
    if privacy.get("unit") == "person" and isinstance(person, dict):
        stream = person.get("stream")  # an upper bound: shown rounded up
        shown = (format_up(stream) if isinstance(stream, int | float) and not isinstance(
            stream, bool) else "?")
        text += f" · {sym}={shown} per person per period"
    return text


def _g(x: Any) -> str:
    return f"{x:g}" if isinstance(x, int | float) and not isinstance(x, bool) else "?"


def _num(x: Any, fmt: str = ".3f") -> str:
    return format(x, fmt) if isinstance(x, int | float) and not isinstance(x, bool) else "?"


COUNTS_HEADER = (
    f"{'TICK':>7}  {'TICK END (UTC)':19}  {'STREAM':30}  {'VALUE':>12}  {'±STDERR':>9}  "
    f"{'STRATEGY':11}  {'p':>6}  PER STREAM"
)


DLQ_HEADER = f"{'REASON':18}  {'FROM (topic:partition@offset)':40}  DETAIL"


def format_dead_letter(msg: dict[str, Any]) -> str:
    """One row for a ``dp.events.dlq`` record: reason, origin, detail (as stored, one line).

    The raw bytes are left out of the table (``--json`` prints the record as stored)."""
    origin = f"{msg.get('topic', '?')}:{msg.get('partition', '?')}@{msg.get('offset', '?')}"
    detail = " ".join(str(msg.get("detail", "")).split())
    return f"{msg.get('reason', '?')!s:18}  {origin:40}  {detail}"


def format_count_row(msg: dict[str, Any]) -> str:
    """One table row for a ``dp.counts.v1`` message."""
    stream = str(msg.get("stream", "?"))
    if len(stream) > 30:
        stream = "…" + stream[-29:]
    return (
        f"{msg.get('tick', '?'):>7}  {_iso(msg.get('tick_end')):19}  {stream:30}  "
        f"{_num(msg.get('value')):>12}  {_num(msg.get('stderr')):>9}  "
        f"{msg.get('strategy', '?')!s:11}  {_num(msg.get('p'), 'g'):>6}  "
        f"{privacy_text(msg.get('privacy'))}"
    )


def _cells_text(cells: Any, width: int = 8) -> str:
    vals = [c for c in cells or () if isinstance(c, int | float)]
    shown = " ".join(f"{c:.1f}" for c in vals[:width])
    return shown + (f" … ({len(vals)} cells)" if len(vals) > width else "")


def _labelled_cells(cells: Any, k: int, width: int = 8) -> str:
    """``00:12.3 01:4.0 10:3.1 11:0.4``: each cell labelled with its yes/no pattern (first
    attribute the leftmost bit, 1 = yes; CONTRACTS.md), the first ``width`` of them."""
    vals = [c for c in cells or () if isinstance(c, int | float)]
    if k < 1 or len(vals) != 1 << k:
        return _cells_text(cells, width)
    shown = " ".join(f"{i:0{k}b}:{c:.1f}" for i, c in enumerate(vals[:width]))
    return shown + (f" … ({len(vals)} cells)" if len(vals) > width else "")


#: the one line that explains the labels of the cells
CELLS_LEGEND = ("cells: one per yes/no combination of the table's attributes, labelled "
                "first attribute = leftmost bit, 1 = yes (e.g. milk,bread 10 = milk, no bread)")


def format_table_row(msg: dict[str, Any]) -> str:
    """One line for a ``dp.tables.v1`` record."""
    names = [str(n) for n in msg.get("names") or ()]
    return (
        f"tick {msg.get('tick', '?'):>6}  epoch {msg.get('epoch', '?')}  "
        f"table {msg.get('table', '?')}/{msg.get('tables', '?')} {msg.get('kind', '?'):7} "
        f"[{','.join(names)}]  {_labelled_cells(msg.get('cells'), len(names))}  "
        f"± {_num(msg.get('stderr'))}{_person_suffix(msg)}"
    )


def _person_suffix(msg: dict[str, Any]) -> str:
    """``  ε=1 · ε=3 per person per period`` for a user-level binary-attribute record (its
    tables' budget per event and what it means for one person); nothing at event level, whose
    lines stay as they were."""
    privacy = msg.get("privacy")
    if not isinstance(privacy, dict) or privacy.get("unit") != "person":
        return ""
    return f"  {privacy_text(privacy)}"


def format_marginals(msg: dict[str, Any], prefix: str = "") -> str:
    """A block for a ``dp.marginals.v1`` message: the structure and the consistent tables."""
    diag = msg.get("diagnostics") or {}
    lines = [
        f"tick {msg.get('tick', '?')} (ends {_iso(msg.get('tick_end'))} UTC), epoch "
        f"{msg.get('epoch', '?')}: {len(msg.get('clusters') or ())} clusters, "
        f"{len(msg.get('bridges') or ())} bridges, total {_num(msg.get('total'), '.1f')}, "
        f"residual {_num(diag.get('residual'), '.2e')}{_person_suffix(msg)}"
    ]
    lines.append(f"  {CELLS_LEGEND}")
    for t in _tables_with(msg, prefix):
        names = [str(n) for n in t.get("names") or ()]
        lines.append(f"  {t.get('kind', '?'):7} [{','.join(names)}]  "
                     f"{_labelled_cells(t.get('cells'), len(names), 16)}"
                     f"  ± {_num(t.get('stderr'))}")
    return "\n".join(lines)


def _tables_with(msg: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    tables = [t for t in msg.get("tables") or () if isinstance(t, dict)]
    if not prefix:
        return tables
    return [t for t in tables if any(str(n).startswith(prefix) for n in t.get("names") or ())]


def answer_queries(msg: dict[str, Any], queries: list[str]) -> dict[str, Any]:
    """``{"tick", "answers": [QueryAnswer.as_dict(), ...]}`` for ``dp.marginals.v1`` ``msg``.

    A query is a comma-separated list of attribute names or indices (``ValueError`` if bad).
    """
    from stream_dp.attributes.query import answer, model_from_marginals

    model, domain = model_from_marginals(msg)
    out = []
    for q in queries:
        parts: list[int | str] = [int(a) if a.strip().isdigit() else a.strip()
                                  for a in q.split(",") if a.strip()]
        out.append(answer(model, parts, domain).as_dict())
    return {"tick": msg.get("tick"), "tick_end": msg.get("tick_end"), "answers": out,
            "schema": "stream-dp.answers.v1"}


def format_answers(got: dict[str, Any]) -> str:
    lines = [f"tick {got.get('tick', '?')} (ends {_iso(got.get('tick_end'))} UTC)"]
    for a in got["answers"]:
        names = a["names"]
        se = a["stderr_bound"]
        lines.append(f"  [{','.join(names)}]  ± {'n/a' if se is None else f'{se:.2f}'}")
        for i, c in enumerate(a["counts"]):
            bits = format(i, f"0{len(names)}b")
            label = " ".join(f"{n}={b}" for n, b in zip(names, bits, strict=True))
            lines.append(f"    {label:50} {c:12.2f}")
    return "\n".join(lines)


def _depth(name: str) -> int:
    if "|" in name:
        return name.count("|") + 1  # grid cell: after total (0) and marginals (1)
    if "=" in name:
        return 1
    return name.count("/") + (0 if name in ("all", "total") else 1)


def _count(n: Any, noun: str) -> str:
    """``1 iteration``, ``3 iterations``, ``? iterations`` (not a count)."""
    if isinstance(n, int) and not isinstance(n, bool):
        return f"{n} {noun}" + ("" if n == 1 else "s")
    return f"? {noun}s"


def format_histogram(msg: dict[str, Any], prefix: str = "") -> str:
    """A block for a ``dp.histograms.v1`` message: a header line and one indented node per line."""
    diag = msg.get("diagnostics") or {}
    nodes = [n for n in msg.get("nodes") or () if str(n.get("stream", "")).startswith(prefix)]
    lines = [
        f"tick {msg.get('tick', '?')} (ends {_iso(msg.get('tick_end'))} UTC): {_count(len(nodes), 'node')}, "
        f"{'consistent' if msg.get('consistent') else 'NOT consistent'}, "
        f"{_count(diag.get('iterations'), 'iteration')}, residual "
        f"{_num(diag.get('residual'), '.2e')}, "
        f"{_num(diag.get('seconds'), '.4f')} s"
    ]
    for node in nodes:
        name = str(node.get("stream", "?"))
        indent = "  " * min(_depth(name), 6)
        lines.append(
            f"  {indent}{name:<{max(40 - len(indent), 10)}} {_num(node.get('value')):>12}"
            f"  (noisy {_num(node.get('noisy'))} ± {_num(node.get('stderr'))})"
        )
    return "\n".join(lines)
