"""Reading the domain file (format in ``docs/configuration.md``) and checking the settings a
binary-attribute domain needs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agents.config.settings import Settings
from agents.config.values import _read_toml
from stream_dp.domain import Domain


def load_domain(path: str | os.PathLike[str]) -> Any:
    """Read a domain file (format in docs/configuration.md): :meth:`Domain.from_file`, or
    :meth:`stream_dp.attributes.BinaryDomain.from_file` for ``kind = "binary"``.

    Every problem is a ``ValueError`` that names the file."""
    try:
        return _load_domain(path)
    except ValueError as exc:
        text = str(exc)
        if str(path) in text:
            raise
        raise ValueError(f"domain file {str(path)!r}: {text}") from None


def _load_domain(path: str | os.PathLike[str]) -> Any:
    # missing, not UTF-8, not TOML: said with the file's name. Parsed once: at 10^7 paths the
    # pure-Python TOML parse is the larger part of a worker's start-up.
    doc = _read_toml(path, "domain file")
    section = doc.get("domain", doc) if isinstance(doc, dict) else {}
    if isinstance(section, dict) and section.get("kind") == "binary":
        from stream_dp.attributes.domain import BinaryDomain

        return BinaryDomain.from_file(path)
    if isinstance(section, dict) and section:
        # parsed once: at 10^6 names the TOML parse takes seconds
        return Domain.from_toml(section)
    return Domain.from_file(Path(path))  # reports the file's problem


def check_attribute_settings(settings: Settings, domain: Any) -> None:
    """Refuse settings a binary-attribute domain cannot run under (``ValueError``): it needs
    pure DP, one release shard and no compact topic; every event counts 1 (cap 1).

    Also checks the numeric range of the mechanism its table banks really run (at ε_t, not ε;
    :func:`stream_dp.attributes.live.check_live_range`) against ``max_events_per_tick``, the
    bound every table cell's count is clipped to. ``naive-int`` is accepted: every cell count
    is a whole number of events, which is all it needs (``auto`` picks it at the defaults)."""
    if getattr(domain, "kind", "") != "binary":
        return
    problems = []
    if settings.privacy_model != "pure":
        problems.append("privacy_model = 'pure' (the whole run is pure ε-DP per event)")
    if settings.shards != 1:
        problems.append("shards = 1 (its tables are small: one shard releases them all)")
    if settings.compact_topic:
        problems.append("no compact_topic (its tables are published as dp.tables.v1 records)")
    if problems:
        raise ValueError(f"a binary-attribute domain ({domain.name!r}) needs "
                         + "; ".join(problems))
    from stream_dp.attributes.live import check_live_range

    try:
        check_live_range(attribute_config(settings, domain))
    except ValueError as exc:
        raise ValueError(
            f"binary-attribute domain {domain.name!r} (max_events_per_tick = "
            f"{settings.max_events_per_tick}, attribute_bootstrap_fraction = "
            f"{settings.attribute_bootstrap_fraction:g}): {exc}") from None


def attribute_config(settings: Settings, domain: Any) -> Any:
    """The :class:`stream_dp.attributes.live.LiveConfig` of a binary-attribute deployment."""
    from stream_dp.attributes.live import LiveConfig

    return LiveConfig(
        m=domain.m, epsilon=float(settings.epsilon), p=float(settings.p),
        epoch_ticks=int(settings.attribute_epoch_ticks),
        bootstrap_fraction=float(settings.attribute_bootstrap_fraction),
        max_cluster=int(settings.attribute_max_cluster), strategy=settings.strategy,
        max_cell_count=int(settings.max_events_per_tick),
    )
