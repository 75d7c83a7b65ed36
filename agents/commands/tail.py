"""``stream-dp tail``: subscribe to the released counts or the consistent histograms.

Reads ``dp.counts.v1`` (one message per released (stream, tick)) or ``dp.histograms.v1`` (one
consistent histogram per reconciled tick) with a group-less consumer (nothing is committed, any
number of tails can run) and prints a table or the messages as JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
from typing import Any, Final, TextIO

from agents.commands._tail_format import (
    CELLS_LEGEND,
    COUNTS_HEADER,
    DLQ_HEADER,
    _tables_with,
    answer_queries,
    format_answers,
    format_count_row,
    format_dead_letter,
    format_histogram,
    format_marginals,
    format_table_row,
)
from agents.kafka.clients import (
    TopicMissingError,
    add_bootstrap_argument,
    bootstrap_from,
    connection_problem,
    default_topic,
    is_kafka_error,
    security_problem,
    topic_partitions,
)

HELP = "subscribe to released counts or consistent histograms (or read the dead letters)"

DESCRIPTION = """\
Print released DP counts (default) or consistent histograms as they are published.

  counts       dp.counts.v1: one line per (stream, tick) with the noisy decayed count, its
               analytic standard error, strategy, decay p and the stream's privacy budget
               (one event feeds h streams and spends h times it: stream-dp plan)
  histograms   dp.histograms.v1: per reconciled tick, every node's consistent value, the noisy
               release it came from and its standard error, as an indented tree
  compact      the compact records (dp.counts.block.v1, one per shard and tick; deployments
               with compact_topic set, docs/formats.md), decoded with the shard manifests
               from <topic>.manifests and shown exactly like counts (table or JSON lines)
  compact-histograms
               the compact histogram chunks (dp.histograms.block.v1 on
               <compact_topic>.histograms), assembled per tick with the node manifest and
               shown exactly like histograms (use --prefix at a million nodes)
  tables       binary-attribute domains: dp.tables.v1 on the counts topic, one noisy
               marginal table per line (tick, structure epoch, attributes, cells ± stderr)
  marginals    binary-attribute domains: dp.marginals.v1 on the histograms topic, the
               consistent tables of each tick; with --query A,B,... (attribute names or
               indices, up to 8; repeatable) the answer to each query instead, computed from
               the consistent tables (junction tree; docs/guide.md section 7)
  dlq          the dead-letter topic (dp.events.dlq, operators only: it holds rejected raw
               events): one line per rejected record with its reason, where it came from
               (topic:partition@offset) and the detail; --json prints each record as stored,
               its raw bytes included. Nothing is added to what the topic holds.

Where to start: live (default: only messages published from now on), --from-beginning (the
whole retained topic) or --from-tick N (from the beginning, showing ticks >= N).
Output: a table (default) or --json (each message as one JSON line, exactly as published).
--prefix P keeps streams whose name starts with P (for histograms: nodes; for tables and
marginals: tables holding an attribute whose name starts with P).
For scripts: --max-messages N stops after N printed messages; --to-end stops at the end of the
topic as it was when tail started (with --from-beginning / --from-tick: "what is there now");
--timeout S stops after S seconds without a new message (note: a running worker publishes every
stream at every tick, zeros included, so --timeout alone does not stop a tail of a live
deployment). Exit status 0 in all three cases.

The broker comes from --bootstrap, else $STREAM_DP_BOOTSTRAP (the worker's variable), else
127.0.0.1:9092; topic names from --topic or $STREAM_DP_COUNTS_TOPIC / $STREAM_DP_HISTOGRAMS_TOPIC
/ $STREAM_DP_COMPACT_TOPIC / $STREAM_DP_DLQ_TOPIC. Read from the beginning (--from-beginning,
--from-tick), releases are printed in tick order across the topic's partitions.

Examples:
  stream-dp tail                                   # live counts, as a table
  stream-dp tail counts --prefix www/ --json       # live counts of the www/ subtree, JSON lines
  stream-dp tail counts --from-tick 100 --max-messages 50
  stream-dp tail histograms --from-beginning --to-end --json | jq .diagnostics
  stream-dp tail counts --from-beginning --to-end --prefix www/ --json > releases.jsonl
  STREAM_DP_BOOTSTRAP=kafka-1:9092 stream-dp tail histograms
  stream-dp tail compact --topic dp.counts.compact --prefix www/ --from-beginning --to-end
  stream-dp tail compact-histograms --prefix www/ --json     # topic from $STREAM_DP_COMPACT_TOPIC
  stream-dp tail marginals --query milk,bread --query 3,7,9 --json
  stream-dp tail dlq --from-beginning --to-end --json | jq -r .reason | sort | uniq -c
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "what", nargs="?",
        choices=("counts", "histograms", "compact", "compact-histograms", "tables", "marginals",
                 "dlq"),
        default="counts",
        help="which output to follow (default: counts)",
    )
    add_bootstrap_argument(parser)
    parser.add_argument("--topic", help="topic name (default from the environment or contract)")
    parser.add_argument("--json", action="store_true", help="print each message as one JSON line")
    parser.add_argument("--prefix", default="",
                        help="only streams/nodes starting with PREFIX (dlq: reasons)")
    parser.add_argument(
        "--query", action="append", default=[], metavar="A,B,...",
        help="marginals: answer this query (attribute names or indices, comma-separated; "
             "repeatable) at every tick instead of printing the tables",
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="read the whole topic")
    start.add_argument(
        "--from-tick", type=int, metavar="N", help="read from the beginning, show ticks >= N"
    )
    parser.add_argument(
        "--max-messages", type=int, metavar="N", help="exit after printing N messages"
    )
    parser.add_argument(
        "--to-end", action="store_true",
        help="exit at the end of the topic as it was when tail started"
    )
    parser.add_argument(
        "--timeout", type=float, metavar="S", help="exit after S seconds without a new message"
    )


# ---------------------------------------------------------------------------------- consuming
class QueryError(ValueError):
    """A ``--query`` that the published tables cannot answer (bad name, index or size)."""


class NoAttributeTables(RuntimeError):
    """``tail tables`` / ``tail marginals`` on a deployment without binary attributes, or
    ``tail counts`` / ``tail histograms`` on one with them."""


class _Printer:
    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args = args
        self.out = out
        self.printed = 0
        self.header_done = False

    def wants(self, msg: dict[str, Any]) -> bool:
        if self.args.what in ("counts", "histograms") and msg.get("schema") in (
                "dp.tables.v1", "dp.marginals.v1"):
            raise NoAttributeTables(
                f"this topic holds {msg.get('schema')} messages, not {self.args.what}: the "
                "deployment's domain has binary attributes (kind = \"binary\"), whose releases "
                "are tables; read them with: stream-dp tail tables (noisy) or stream-dp tail "
                "marginals (consistent; --query A,B answers)")
        if self.args.what == "dlq":  # --prefix: reasons starting with it
            return str(msg.get("reason", "")).startswith(self.args.prefix)
        if self.args.from_tick is not None:
            tick = msg.get("tick")
            if not isinstance(tick, int) or tick < self.args.from_tick:
                return False
        if self.args.what in ("counts", "compact"):
            return str(msg.get("stream", "")).startswith(self.args.prefix)
        if self.args.what == "compact-histograms":
            return True  # nodes already chosen by prefix
        if self.args.what in ("tables", "marginals") and msg.get("schema") in (
                "dp.counts.v1", "dp.histograms.v1"):
            raise NoAttributeTables(
                f"this topic holds {msg.get('schema')} messages, not {self.args.what}: "
                "the deployment has no binary "
                "attributes (kind = \"binary\"), so it publishes no tables or marginals; "
                f"read its releases with: stream-dp tail "
                f"{'counts' if msg.get('schema') == 'dp.counts.v1' else 'histograms'}")
        if self.args.what == "tables":
            return msg.get("schema") == "dp.tables.v1" and (not self.args.prefix or any(
                str(n).startswith(self.args.prefix) for n in msg.get("names") or ()))
        if self.args.what == "marginals":
            return msg.get("schema") == "dp.marginals.v1" and (
                not self.args.prefix or bool(_tables_with(msg, self.args.prefix)))
        if self.args.prefix:
            return any(
                str(n.get("stream", "")).startswith(self.args.prefix)
                for n in msg.get("nodes") or ()
            )
        return True

    def show(self, raw: bytes) -> None:
        try:
            msg = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            print(f"(skipping a message that is not JSON: {raw[:60]!r})", file=sys.stderr)
            return
        if not isinstance(msg, dict):
            return
        self.show_message(msg, raw)

    def show_message(self, msg: dict[str, Any], raw: bytes | None = None) -> None:
        """Print one decoded message (``raw``: its bytes as published, for ``--json``)."""
        if not self.wants(msg):
            return
        if self.args.what == "marginals" and self.args.query:
            try:
                got = answer_queries(msg, self.args.query)
            except ValueError as exc:
                raise QueryError(str(exc)) from None
            print(json.dumps(got, separators=(",", ":")) if self.args.json
                  else format_answers(got), file=self.out)
        elif self.args.json:
            if self.args.what == "histograms" and self.args.prefix:
                msg = {**msg, "nodes": [n for n in msg.get("nodes") or ()
                                        if str(n.get("stream", "")).startswith(self.args.prefix)]}
                line = json.dumps(msg, separators=(",", ":"))
            else:
                line = raw.decode() if raw is not None else json.dumps(msg, separators=(",", ":"))
            print(line, file=self.out)
        elif self.args.what in ("counts", "compact"):
            if not self.header_done:
                print(COUNTS_HEADER, file=self.out)
                self.header_done = True
            print(format_count_row(msg), file=self.out)
        elif self.args.what == "dlq":
            if not self.header_done:
                print(DLQ_HEADER, file=self.out)
                self.header_done = True
            print(format_dead_letter(msg), file=self.out)
        elif self.args.what == "tables":
            if not self.header_done:
                print(CELLS_LEGEND, file=self.out)
                self.header_done = True
            print(format_table_row(msg), file=self.out)
        elif self.args.what == "marginals":
            print(format_marginals(msg, self.args.prefix), file=self.out)
        else:
            print(format_histogram(msg, self.args.prefix), file=self.out)
        self.out.flush()
        self.printed += 1

    @property
    def done(self) -> bool:
        return self.args.max_messages is not None and self.printed >= self.args.max_messages


async def tail(args: argparse.Namespace, out: TextIO, stop: asyncio.Event | None = None) -> int:
    """Consume and print per ``args`` until a limit, ``stop`` or a signal; returns exit status."""
    from aiokafka import AIOKafkaConsumer

    from agents.kafka.fetch_backoff import install_from_env

    install_from_env()  # an idle tail must not busy-poll a broker that answers at once

    if args.what == "compact-histograms":
        base = default_topic("compact")
        topic = args.topic or (f"{base}.histograms" if base else "")
    else:
        topic = args.topic or default_topic(args.what)
    if not topic:
        raise TopicMissingError("compact output needs --topic or $STREAM_DP_COMPACT_TOPIC "
                                "(the deployment's compact_topic)")
    from agents.config.security import client_kwargs

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_from(args.bootstrap),
        **client_kwargs(),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="latest",
        isolation_level="read_committed",
        # compact records and histogram chunks are a few MiB each
        max_partition_fetch_bytes=(16 << 20) if args.what.startswith("compact") else 1 << 20,
    )
    from agents.kafka.clients import start_client

    await start_client(consumer)
    printer = _Printer(args, out)
    loop = asyncio.get_running_loop()
    try:
        tps = await topic_partitions(consumer, topic)
        consumer.assign(tps)
        if args.from_beginning or args.from_tick is not None:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
            for tp in tps:  # resolve the live position now, before anything new is published
                await consumer.position(tp)
        where = ("live" if not (args.from_beginning or args.from_tick is not None)
                 else f"from tick {args.from_tick}" if args.from_tick is not None
                 else "from the beginning")
        ends = await consumer.end_offsets(tps) if getattr(args, "to_end", False) else None

        async def at_end() -> bool:
            if ends is None:
                return False
            for tp in tps:
                if await consumer.position(tp) < ends[tp]:
                    return False
            return True

        manifests: dict[str, Any] = {}
        #: (manifest sha256, prefix) -> the chosen streams' names
        chosen: dict[tuple[str, str], list[str]] = {}

        async def expand(value: bytes) -> list[dict[str, Any]]:
            """A compact record as dp.counts.v1 messages (its manifest read on first need)."""
            from stream_dp.compact import decode_block

            try:
                block = decode_block(value)
            except ValueError as exc:
                print(f"(skipping a record that is not dp.counts.block.v1: {exc})",
                      file=sys.stderr)
                return []
            if args.from_tick is not None and block.tick < args.from_tick:
                return []
            shard = str(block.header["shard"])
            known = manifests.get(shard)
            if known is None or known.sha256 != block.header["manifest"]:
                manifests.update(await _read_manifests(consumer.__class__, args, f"{topic}.manifests"))
                known = manifests.get(shard)
            if known is None or known.sha256 != block.header["manifest"]:
                print(f"(skipping tick {block.tick} of {shard}: its manifest is not published)",
                      file=sys.stderr)
                return []
            key = (known.sha256, args.prefix)
            if key not in chosen:
                chosen[key] = [n for n in known.streams if n.startswith(args.prefix)]
            names = chosen[key]
            if len(names) == len(known.streams):
                return list(block.records(known))
            return list(block.records(known, names))

        from stream_dp.compact_histograms import HistogramAssembler, decode_histogram_chunk

        histograms = HistogramAssembler()
        node_names: dict[str, Any] = {}

        async def assemble(value: bytes) -> list[dict[str, Any]]:
            """A compact histogram chunk; the tick's dp.histograms.v1 view once complete."""
            try:
                hist = histograms.add(decode_histogram_chunk(value))
            except ValueError as exc:
                print(f"(skipping a record that is not dp.histograms.block.v1: {exc})",
                      file=sys.stderr)
                return []
            if hist is None or (args.from_tick is not None and hist.tick < args.from_tick):
                return []
            if hist.manifest not in node_names:
                from agents.kafka.manifests import histogram_manifests_topic

                for man in (await _read_manifests(consumer.__class__, args,
                                                  histogram_manifests_topic(topic),
                                                  histogram=True)).values():
                    keep = [i for i, n in enumerate(man.streams) if n.startswith(args.prefix)]
                    node_names[man.sha256] = (man.streams, keep)
            if hist.manifest not in node_names:
                print(f"(skipping tick {hist.tick}: its node manifest is not published)",
                      file=sys.stderr)
                return []
            names, keep = node_names[hist.manifest]
            return [hist.message(names, keep if args.prefix else None)]

        print(f"stream-dp tail: following {topic} ({len(tps)} partition{'s' if len(tps) != 1 else ''}) {where}; "
              "Ctrl-C stops", file=sys.stderr, flush=True)
        # what was published before we started is printed in tick order across partitions
        # (each partition is in tick order; a plain read printed them one after another)
        merge = (TickMerge(await consumer.end_offsets(tps))
                 if where != "live" and args.what in TICK_ORDERED else None)
        last_message = loop.time()
        while not printer.done and not (stop is not None and stop.is_set()):
            if await at_end():
                break
            batch = await consumer.getmany(timeout_ms=200, max_records=500)
            if merge is not None:
                positions = {tp: await consumer.position(tp) for tp in tps}
                for value in merge.add(batch, positions):
                    printer.show(value)
                    if printer.done:
                        break
                if merge.caught_up:
                    merge = None
                if batch:
                    last_message = loop.time()
                elif args.timeout is not None and loop.time() - last_message >= args.timeout:
                    break
                continue
            records = sorted(
                (m for msgs in batch.values() for m in msgs), key=lambda m: (m.timestamp, m.offset)
            )
            for m in records:
                if m.value is not None:
                    if args.what in ("compact", "compact-histograms"):
                        decoded = (await expand(m.value) if args.what == "compact"
                                   else await assemble(m.value))
                        for msg in decoded:
                            printer.show_message(msg)
                            if printer.done:
                                break
                    else:
                        printer.show(m.value)
                if printer.done:
                    break
            if records:
                last_message = loop.time()
            elif args.timeout is not None and loop.time() - last_message >= args.timeout:
                break
        if merge is not None and not (stop is not None and stop.is_set()):
            for value in merge.flush():  # --to-end, --timeout: what was read, in tick order
                if printer.done:
                    break
                printer.show(value)
    finally:
        await consumer.stop()
    return 0


#: what ``tail`` prints in tick order when it reads what was published before it started
TICK_ORDERED: Final = ("counts", "histograms", "tables", "marginals")


class TickMerge:
    """Orders the records of several partitions by tick while ``tail`` catches up.

    Records wait until every partition not yet read to its end (as it was at start, ``ends``)
    has delivered a tick at least as late: a partition's records come in tick order, so nothing
    earlier can still arrive. Then they are released sorted by (tick, partition, offset). Once
    every partition has reached its starting end, everything held is released and
    :attr:`caught_up` turns true (from then on records are printed as they come).
    """

    def __init__(self, ends: dict[Any, int]) -> None:
        self.ends = dict(ends)
        self.held: list[tuple[float, int, int, bytes]] = []
        self.last_tick: dict[Any, float] = {}
        self.caught_up = False

    def add(self, batch: dict[Any, list[Any]], positions: dict[Any, int]) -> list[bytes]:
        """Hold ``batch``'s records; return those now in order (``positions``: each
        partition's next offset)."""
        for tp, msgs in batch.items():
            for m in msgs:
                if m.value is None:
                    continue
                tick = _tick_of(m.value)
                self.held.append((tick, tp.partition, m.offset, m.value))
                self.last_tick[tp] = max(self.last_tick.get(tp, -math.inf), tick)
        open_ = [tp for tp, end in self.ends.items() if positions.get(tp, 0) < end]
        if not open_:
            self.caught_up = True
            return self.flush()
        watermark = min(self.last_tick.get(tp, -math.inf) for tp in open_)
        ready = [h for h in self.held if h[0] < watermark]
        if not ready:
            return []
        self.held = [h for h in self.held if h[0] >= watermark]
        return [h[3] for h in sorted(ready)]

    def flush(self) -> list[bytes]:
        """Everything held, in tick order."""
        out = [h[3] for h in sorted(self.held)]
        self.held = []
        return out


def _tick_of(value: bytes) -> float:
    """A JSON release's ``tick`` (``-inf`` if it has none: printed first, as it comes)."""
    try:
        tick = json.loads(value).get("tick")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return -math.inf
    return float(tick) if isinstance(tick, int) and not isinstance(tick, bool) else -math.inf


async def _read_manifests(consumer_class: Any, args: argparse.Namespace, topic: str,
                          histogram: bool = False) -> dict[str, Any]:
    """Every shard's newest manifest in ``topic`` (read from the beginning to its end); or the
    histogram's node manifest."""
    from agents.config.security import client_kwargs
    from agents.kafka.manifests import read_manifests

    return await read_manifests(bootstrap_from(args.bootstrap), client_kwargs(), topic,
                                consumer_class, histogram=histogram)


def run(args: argparse.Namespace) -> int:
    if args.max_messages is not None and args.max_messages < 1:
        print("stream-dp tail: --max-messages must be ≥ 1", file=sys.stderr)
        return 2
    if args.timeout is not None and not args.timeout > 0:
        print("stream-dp tail: --timeout must be > 0 seconds", file=sys.stderr)
        return 2
    if args.from_tick is not None and not 0 <= args.from_tick < 2**62:
        print(f"stream-dp tail: --from-tick must be an integer in [0, 2**62), got "
              f"{args.from_tick}", file=sys.stderr)
        return 2
    if args.what == "dlq" and args.from_tick is not None:
        print("stream-dp tail: dead letters have no tick: use --from-beginning with dlq",
              file=sys.stderr)
        return 2
    if args.query and args.what != "marginals":
        print("stream-dp tail: --query needs 'marginals' (stream-dp tail marginals --query A,B)",
              file=sys.stderr)
        return 2
    for q in args.query:
        n = len([a for a in q.split(",") if a.strip()])
        if not 1 <= n <= 8:
            print(f"stream-dp tail: --query {q!r} must name 1 to 8 attributes", file=sys.stderr)
            return 2
    problem = security_problem()
    if problem:
        print(f"stream-dp tail: {problem}", file=sys.stderr)
        return 2

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await tail(args, sys.stdout, stop)

    try:
        return asyncio.run(main())
    except (TopicMissingError, NoAttributeTables) as exc:
        print(f"stream-dp tail: {exc}", file=sys.stderr)
        return 1
    except QueryError as exc:
        print(f"stream-dp tail: --query: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # connection and TLS/SASL failures: one line, no traceback
        if not is_kafka_error(exc):
            raise
        print(f"stream-dp tail: {connection_problem(exc, bootstrap_from(args.bootstrap))}",
              file=sys.stderr)
        return 1
    except BrokenPipeError:  # `stream-dp tail | head`
        with contextlib.suppress(OSError):
            sys.stdout.close()
        return 0
