"""The text of ``docs/configuration.md`` (:func:`configuration_markdown`), generated from the
settings' own documentation; ``python -m agents.config`` writes it.

Moved out of :mod:`agents.config` (which re-exports these names).
"""

from __future__ import annotations

import dataclasses

from agents.config_env import OTHER_VARIABLES
from agents.config_settings import Settings
from agents.config_values import env_var


# ---------------------------------------------------------------------- documentation
def settings_table() -> str:
    """The Markdown table of every setting: name, variable, default, meaning."""
    lines = [
        "| name | environment variable | default | meaning |",
        "|---|---|---|---|",
    ]
    for f in dataclasses.fields(Settings):
        shown = f.metadata.get("shown") or repr(f.default).strip("'")
        lines.append(f"| `{f.name}` | `{env_var(f.name)}` | `{shown}` | {f.metadata['doc']} |")
    return "\n".join(lines) + "\n"


_DOMAIN_FORMAT = """\
## The domain file

The domain file (TOML, setting `domain_file`, read by `stream_dp.domain.Domain.from_file`)
declares every released stream up front; the release schedule never depends on the data, and an
event whose key is not declared goes to the dead-letter topic (reason `unknown_key`), never
creating a stream. Keys go at the top level or in a `[domain]` table. Three kinds:

```toml
# flat: independent streams; an event's key is a stream name.
name = "shops"
kind = "flat"
streams = ["paris", "berlin", "rome"]
```

```toml
# hierarchy: leaf paths; internal nodes and the root are released too.
# An event's key is a leaf path and feeds the leaf and all its ancestors.
name = "sales"
kind = "hierarchy"
root = "all"        # name of the root node (default "all"; "" for a forest)
sep = "/"           # path separator (default "/")
paths = ["eu/fr/paris", "eu/fr/lyon", "eu/de/berlin", "us/ny/nyc"]
# or explicit parents instead of paths ("" = a root):
# streams = ["all", "eu", "us"]
# parents = ["", "all", "all"]
```

```toml
# grid: attributes with categories; nodes are `total`, every `attr=cat` marginal and every
# cell `a1=c1|a2=c2`. An event's key is a cell name (attributes in any order) and feeds the
# total, one category per attribute and the cell.
name = "census"
kind = "grid"
[attributes]
region = ["north", "south"]
age = ["young", "old"]
```

Optional extra linear constraint groups for the consistency engine (any kind):
`[[constraints]]` tables with `name`, `matrix` (rows of coefficients) and `rows` (lists of node
names); see the docstring of `stream_dp.domain`.

Privacy: each released node spends `epsilon` (or `rho`) per event; an event feeding `h` nodes
(hierarchy depth, or attributes + 2 for a grid: `Domain.touches`) spends `h` times that.

```toml
# binary: up to 64 yes/no attributes; the service chooses which marginal tables to measure.
# An event carries "attrs": a string of m characters 0/1 (character i = attribute i) or the list
# of the names of its 1-attributes; "key" is optional, "value" must be absent or 1.
name = "basket"
kind = "binary"
attributes = ["milk", "bread", "eggs"]
```

Binary-attribute domains spend `epsilon` per event **in total** (not per table): each structure
epoch (`attribute_epoch_ticks`) splits it into the epoch's bootstrap and its tables; they need
`privacy_model = "pure"`, `shards = 1` and no `compact_topic`. Records: `dp.tables.v1` on the
counts topic, `dp.marginals.v1` on the histograms topic (docs/CONTRACTS.md).
"""

_INTRO = """\
# Configuration

A worker reads its settings from built-in defaults, then a TOML file (`--config FILE` or
`STREAM_DP_CONFIG`: a flat table of the setting names below), then `STREAM_DP_*` environment
variables (highest precedence). Relative paths in the TOML file are resolved against its folder.
An example is `examples/stream-dp.toml`.

Ticks: tick `n` (1-based) covers event times `[origin + (n−1)·tick_seconds, origin + n·tick_seconds)`.
Its deadline is its end plus `allowed_lateness_s`. The schedule never depends on the data: with
`schedule = "clock"` ticks close on the public clock (deadline + `close_grace_s`), with
`schedule = "markers"` at the close markers of `stream-dp replay`; an event's tick and lateness
come from its own record (event time, Kafka record timestamp). Closing points are persisted on
`schedule_topic`. Details: docs/privacy.md ("The release schedule").

The noise key comes from `key_file` or the variable `STREAM_DP_KEY` (hex, or raw text of at least
32 bytes; visibly low-entropy keys and key files readable by group or others are refused). Make
one with `(umask 077; python -c 'import secrets; print(secrets.token_hex(32))' > noise.key)` (or
`(umask 077; head -c 32 /dev/urandom | xxd -p -c 64 > noise.key)`). It is never logged, never in
`repr(Settings)`, and never written to any topic. Keys derived from it (never the key itself)
MAC the checkpoints, the close markers and the persisted closing points, and key the schedule
digest.

This file is generated by `agents.config.configuration_markdown()`; a unit test keeps it current.

## Settings

"""

_OTHER_VARIABLES_HEAD = """\
## Other environment variables

Every `STREAM_DP_*` variable is a setting's (table above) or one of these; any other name is
refused by every command and by the worker, with the closest known name (`unknown environment
variable STREAM_DP_EPSILOM (did you mean STREAM_DP_EPSILON?)`, exit status 2), as an unknown
name in the TOML file is.

| variable | used by | meaning |
|---|---|---|
"""

_BLAS_ROW = (
    "| `OPENBLAS_NUM_THREADS`, `OMP_NUM_THREADS`, `MKL_NUM_THREADS` | every `stream-dp` command "
    "| BLAS threads; **default 1** when unset (the command sets it before NumPy loads). "
    "OpenBLAS's threads busy-wait for each other: with the host's cores busy (broker, producers, "
    "other workers) the plan search a worker runs at start-up took 13.5 s instead of 0.5 s on a "
    "2-core machine. Set it higher only for large offline `plan` runs on idle cores |\n"
)

_OTHER_VARIABLES_TAIL = """
The security settings (`security_protocol`, `ssl_*`, `sasl_*`) are read from the same
`STREAM_DP_*` variables by every command-line tool (`topics`, `tail`, `replay`, `simulate
--to-topic`), so one environment serves the worker and the tools.
"""


def other_variables_markdown() -> str:
    """The "Other environment variables" section (from :data:`agents.config_env.OTHER_VARIABLES`)."""
    rows = "".join(f"| `{name}` | {used} | {meaning} |\n"
                   for name, (used, meaning) in OTHER_VARIABLES.items())
    return _OTHER_VARIABLES_HEAD + rows + _BLAS_ROW + _OTHER_VARIABLES_TAIL


_INTERNAL = """\
## Internal topics and raw counts

An event feeds several released nodes (leaf and ancestors, or total, marginals and cell) that
live in different release shards, so ingest (per events partition) hands each release shard, at
every tick close, one message with that partition's **raw** per-node counts for the tick
(`dp.partials.v1`, even when empty). This is the one place where un-noised counts leave a
worker's memory. It is an internal topic: written and read only inside transactions of the
service, never consumed by user-facing tools (`tail`, dashboard, replay), created with short
retention (`partials_retention_s`), and it must carry the same access controls as the events
topic itself (it holds nothing that the events topic does not already reveal). The checkpoint
topics hold counter state (which includes pre-noise sums) and open tick buckets: same rule.
"""


def configuration_markdown() -> str:
    """The full text of ``docs/configuration.md``."""
    return (_INTRO + settings_table() + "\n" + other_variables_markdown() + "\n" + _DOMAIN_FORMAT + "\n"
            + _INTERNAL)
