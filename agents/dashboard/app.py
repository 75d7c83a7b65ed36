"""The live dashboard: an aiohttp sub-application fed by the counts and histogram topics.

It holds no DP logic: it subscribes (group-less aiokafka consumer, from the latest offsets) to the
user-facing topics ``dp.counts.v1`` and ``dp.histograms.v1`` only, keeps the last
``history`` ticks of every stream (fewer when there are so many streams that the total would
exceed ``max_points``: memory stays bounded at any domain size) and the latest consistent
histogram in memory, and pushes them
to browsers as server-sent events. The page and its JavaScript/SVG chart are static files shipped
in the package (``agents/dashboard/static/``; no CDN).

Routes (relative to the mount point, ``/dashboard/`` in the worker):

* ``GET /`` — the page; ``GET /static/...`` — its assets;
* ``GET /events[?prefix=P]`` — SSE: ``snapshot`` (everything held, once), then ``counts`` (a
  batch of ``[stream, tick, tick_end, value, stderr]`` rows) and ``histogram`` (a
  ``dp.histograms.v1`` message) as they arrive, ``meta`` (the strategy, p, privacy, cap and
  horizon of the newest streams, before their first rows) and ``status`` (consumer state); only streams
  starting with ``P`` when given;
* ``GET /api/snapshot[?prefix=P][&limit=N[&after=S]]`` — the same snapshot as JSON (for
  scripts and tests); histogram nodes filtered by the prefix too; with ``limit`` one page of at
  most N streams (name order) after stream ``S``, and ``next``: the ``after`` of the next page
  (``null`` on the last one).

Compact output (``compact_topic`` set): the dashboard reads the ``dp.counts.block.v1`` records
instead of the per-stream messages (zero-copy columns, decoded off the event loop) and follows
the first :data:`COMPACT_STREAMS` streams of all shards' manifests together (bounded memory and
CPU at any domain size; the consistent histogram still covers every node).

Binary-attribute domains: each ``dp.tables.v1`` record becomes one series per table cell (named
``a=1,b=0``: the cell's attribute values) and the latest ``dp.marginals.v1`` message (the
consistent tables, the chosen clusters and bridges) is held and pushed as ``marginals``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from agents.dashboard.state import DEFAULT_HISTORY, DashboardState

log = logging.getLogger(__name__)

#: the dashboard consumer's pause after empty fetches grows to this many times its first (5 x
#: empty_fetch_backoff_ms): ~1 s between ticks (agents.kafka.fetch_backoff.pace)
_IDLE_GROWTH = 4.0

STATIC_DIR: Final = Path(__file__).with_name("static")
_HEARTBEAT_S: Final = 15.0
#: streams followed from the compact records (over all shards)
COMPACT_STREAMS: Final = 20_000
#: nodes of a compact histogram held and shown (the first ones of the node manifest)
COMPACT_NODES: Final = 5_000


def budget_units(domain: Any) -> tuple[tuple[str, int], ...]:
    """What the charts multiply a record's budget by: per stream and per event for a stream
    domain (one event feeds h streams); a binary-attribute domain's records already carry the
    whole run's budget per event."""
    if getattr(domain, "kind", "") == "binary":
        return (("event, whole run", 1),)
    from stream_dp.accounting import Accountant
    from stream_dp.budget import PureDP

    # the multipliers depend on the domain only (h), not on the budget
    return Accountant.for_domain(domain, PureDP(1.0)).budget_units()


def _security_of(settings: Any) -> Any:
    from agents.config.security import KafkaSecurity

    if not hasattr(settings, "security_protocol"):
        return None
    return KafkaSecurity.from_settings(settings)


@dataclass(frozen=True)
class DashboardConfig:
    """Where the dashboard reads from: broker, topic names, ticks of history kept per stream."""

    bootstrap: str
    counts_topic: str = "dp.counts.v1"
    histograms_topic: str = "dp.histograms.v1"
    history: int = DEFAULT_HISTORY
    #: TLS / SASL (:class:`agents.config.security.KafkaSecurity`); ``None``: the environment's
    security: Any = None
    #: read the compact records of this topic instead of the per-stream messages ("": JSON)
    compact_topic: str = ""
    shards: int = 1
    #: read the compact histogram chunks of this topic instead of ``histograms_topic`` ("": JSON)
    histogram_blocks_topic: str = ""
    #: ``(unit, multiplier)`` pairs the charts show the budget for (:func:`budget_units`);
    #: empty: the records' own (per-stream) budget only
    budget_units: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise ValueError("bootstrap must be a non-empty host:port list")
        if not 1 <= self.history <= 100_000:
            raise ValueError(f"history must be in [1, 100000] ticks, got {self.history}")

    @classmethod
    def from_settings(cls, settings: Any, history: int = DEFAULT_HISTORY) -> DashboardConfig:
        """From ``agents.config.settings.Settings`` (or anything with the same attribute names)."""
        return cls(
            bootstrap=settings.bootstrap,
            counts_topic=settings.counts_topic,
            histograms_topic=settings.histograms_topic,
            history=history,
            security=_security_of(settings),
            compact_topic=(getattr(settings, "compact_topic", "")
                           if not getattr(settings, "counts_json", 1) else ""),
            shards=int(getattr(settings, "shards", 1)),
            histogram_blocks_topic=(getattr(settings, "histogram_blocks_topic", "")
                                    if not getattr(settings, "histograms_json", 1) else ""),
        )


STATE_KEY: Final = web.AppKey("dashboard_state", DashboardState)
CONFIG_KEY: Final = web.AppKey("dashboard_config", DashboardConfig)


# ---------------------------------------------------------------------------------- consumer
async def _consume(config: DashboardConfig, state: DashboardState) -> None:
    """Follow both topics from their latest offsets until cancelled; reconnects on errors."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from agents.config.security import client_kwargs
    from agents.kafka.aborted_transactions import install
    from agents.kafka.fetch_backoff import FETCHER_IDLE_MS, pace, slow_down

    install()
    counts_topic = config.compact_topic or config.counts_topic
    blocks_topic = config.histogram_blocks_topic
    topics = (counts_topic, blocks_topic or config.histograms_topic)
    manifests: dict[str, Any] = {}
    nodes = _NodeView(config)
    big = bool(config.compact_topic or blocks_topic)
    while True:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=config.bootstrap, group_id=None, enable_auto_commit=False,
            auto_offset_reset="latest", isolation_level="read_committed",
            # compact records and histogram chunks are a few MiB each
            max_partition_fetch_bytes=(16 << 20) if big else 1 << 20,
            consumer_timeout_ms=FETCHER_IDLE_MS,
            **client_kwargs(config.security),
        )
        try:
            await consumer.start()
            # a dashboard may show a tick up to 250 ms later: 5x fewer empty fetches, the pause
            # growing to 4x that (1 s by default) between ticks (issue #35: an idle worker's
            # in-process dashboard fetched 4 times a second)
            slow_down(consumer)
            pace(consumer, _IDLE_GROWTH)
            tps: list[TopicPartition] = []
            while not tps:
                await consumer.topics()
                for topic in topics:
                    tps += [TopicPartition(topic, p)
                            for p in sorted(consumer.partitions_for_topic(topic) or ())]
                if len(tps) and all(consumer.partitions_for_topic(t) for t in topics):
                    break
                tps = []
                state.error = f"waiting for topics {', '.join(topics)}"
                await asyncio.sleep(1.0)
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            for tp in tps:
                await consumer.position(tp)
            state.connected, state.error = True, ""
            state.broadcast("status", state.status())
            while True:  # nothing else to do here: wait for records as long as they take
                batch = await consumer.getmany(timeout_ms=5000, max_records=5000)
                counts: list[dict[str, Any]] = []
                compact_rows: list[list[Any]] | None = [] if state.subscribers else None
                for tp, records in batch.items():
                    if config.compact_topic and tp.topic == counts_topic:
                        for cols in await _compact_columns(config, records, manifests):
                            state.add_columns(*cols, compact_rows)
                        continue
                    if blocks_topic and tp.topic == blocks_topic:
                        for view in await nodes.add(records):
                            if _newer_histogram(state.histogram, view):
                                state.histogram = view
                                state.messages += 1
                                state.broadcast("histogram", view)
                        continue
                    for rec in records:
                        try:
                            msg = json.loads(rec.value) if rec.value is not None else None
                        except ValueError:
                            continue
                        if not isinstance(msg, dict):
                            continue
                        if tp.topic == config.counts_topic:
                            counts.append(msg)
                        elif msg.get("schema") == "dp.marginals.v1":
                            if _newer_marginals(state.marginals, msg):
                                state.marginals = msg
                                state.messages += 1
                                state.broadcast("marginals", msg)
                        elif _newer_histogram(state.histogram, msg):
                            state.histogram = msg
                            state.messages += 1
                            state.broadcast("histogram", msg)
                rows = state.add_counts(counts) if counts else []
                if state.meta_changed:  # before the rows of the streams it labels
                    state.meta_changed = False
                    state.broadcast("meta", state.meta)
                if compact_rows:
                    state.broadcast("counts", compact_rows)
                if rows:
                    state.broadcast("counts", rows)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # broker gone, etc.: show it and retry
            state.connected, state.error = False, f"{type(exc).__name__}: {exc}"
            state.broadcast("status", state.status())
            log.warning("dashboard consumer error; retrying", extra={"error": state.error})
            await asyncio.sleep(2.0)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()


#: one compact record's followed streams: (streams, tick, tick_end, values, stderr, meta)
CompactColumns = tuple[Sequence[str], int, float, list[float], list[float], dict[str, Any]]


async def _compact_columns(config: DashboardConfig, records: list[Any],
                           manifests: dict[str, Any]) -> list[CompactColumns]:
    """The followed streams (the first :data:`COMPACT_STREAMS` over all shards) of compact
    records, as columns for :meth:`DashboardState.add_columns` (decoded in a worker thread;
    manifests read on first need). No per-stream message is built: at 10^6 streams that was
    most of the dashboard's CPU per tick."""
    from stream_dp.compact import decode_block

    blocks = []
    for rec in records:
        try:
            blocks.append(decode_block(rec.value))
        except (ValueError, TypeError):
            continue
    if any(str(b.header["shard"]) not in manifests
           or manifests[str(b.header["shard"])].sha256 != b.header["manifest"] for b in blocks):
        from agents.config.security import client_kwargs
        from agents.kafka.manifests import read_manifests

        manifests.update(await read_manifests(config.bootstrap, client_kwargs(config.security),
                                              f"{config.compact_topic}.manifests"))
    per_shard = max(1, COMPACT_STREAMS // max(1, config.shards))

    def expand() -> list[CompactColumns]:
        out: list[CompactColumns] = []
        for b in blocks:
            man = manifests.get(str(b.header["shard"]))
            if man is None or man.sha256 != b.header["manifest"]:
                continue
            try:
                b.check(man)
            except ValueError:
                continue
            h = b.header
            privacy = dict(h["privacy"])
            # the dp.counts.v1 view's field order (Block.records): model first
            privacy = {"model": privacy.pop("model", None), **privacy}
            meta = {"strategy": h["strategy"], "p": h["p"], "privacy": privacy,
                    "cap": h["cap"], "horizon": h["horizon"]}
            # the first streams of the manifest: no name index of the whole shard needed
            out.append((man.streams[:per_shard], int(h["tick"]), float(h["tick_end"]),
                        b.values[:per_shard].tolist(), b.stderr[:per_shard].tolist(), meta))
        return out

    return await asyncio.to_thread(expand)


class _NodeView:
    """Compact histogram chunks → ``dp.histograms.v1``-shaped messages of the first
    :data:`COMPACT_NODES` nodes (the top of a hierarchy; ``total_nodes`` says how many there
    are). Only those nodes' names are kept from the node manifest."""

    def __init__(self, config: DashboardConfig) -> None:
        from stream_dp.compact_histograms import HistogramAssembler

        self.config = config
        self.assembler = HistogramAssembler()
        #: (manifest sha256, names of the first nodes)
        self.names: tuple[str, tuple[str, ...]] = ("", ())

    async def add(self, records: list[Any]) -> list[dict[str, Any]]:
        from stream_dp.compact_histograms import decode_histogram_chunk

        def assemble() -> list[Any]:
            done = []
            for rec in records:
                try:
                    hist = self.assembler.add(decode_histogram_chunk(rec.value))
                except (ValueError, TypeError):
                    continue
                if hist is not None:
                    done.append(hist)
            return done

        out = []
        for hist in await asyncio.to_thread(assemble):
            if hist.manifest != self.names[0]:
                await self._read_names()
            if hist.manifest != self.names[0]:
                log.warning("histogram chunks without their node manifest; skipped",
                            extra={"tick": hist.tick})
                continue
            out.append(hist.head_message(self.names[1]))
        return out

    async def _read_names(self) -> None:
        from agents.config.security import client_kwargs
        from agents.kafka.manifests import histogram_manifests_topic, read_manifests

        cfg = self.config
        found = await read_manifests(cfg.bootstrap, client_kwargs(cfg.security),
                                     histogram_manifests_topic(cfg.histogram_blocks_topic),
                                     histogram=True)
        for man in found.values():
            self.names = (man.sha256, tuple(man.streams[:COMPACT_NODES]))


def _newer_marginals(current: dict[str, Any] | None, msg: dict[str, Any]) -> bool:
    if not isinstance(msg.get("tables"), list) or not isinstance(msg.get("tick"), int):
        return False
    return current is None or int(msg["tick"]) >= int(current.get("tick", 0))


def _newer_histogram(current: dict[str, Any] | None, msg: dict[str, Any]) -> bool:
    if not isinstance(msg.get("nodes"), list):
        return False
    if current is None:
        return True
    try:
        return int(msg["tick"]) >= int(current["tick"])
    except (KeyError, TypeError, ValueError):
        return False


async def _consumer_ctx(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(_consume(app[CONFIG_KEY], app[STATE_KEY]), name="dashboard-consumer")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _on_shutdown(app: web.Application) -> None:
    state = app[STATE_KEY]
    for q in list(state.subscribers):
        q.put_nowait(None)  # end every open SSE response so shutdown does not wait for them


# ---------------------------------------------------------------------------------- handlers
async def _index(request: web.Request) -> web.StreamResponse:
    if not request.path.endswith("/"):
        raise web.HTTPFound(request.path + "/")  # the page uses relative URLs
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


async def _snapshot(request: web.Request) -> web.Response:
    prefix = request.query.get("prefix", "")
    after = request.query.get("after", "")
    limit: int | None = None
    if "limit" in request.query:
        try:
            limit = int(request.query["limit"])
        except ValueError:
            limit = -1
        if not 1 <= limit <= 100_000:
            raise web.HTTPBadRequest(text="limit must be an integer in [1, 100000]")
    return web.json_response(request.app[STATE_KEY].snapshot(prefix, limit, after))


def _sse(kind: str, payload: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _events(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    prefix = request.query.get("prefix", "")
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await resp.prepare(request)
    queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()
    state.subscribers.add(queue)
    try:
        await resp.write(b"retry: 2000\n\n" + _sse("snapshot", state.snapshot(prefix)))
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), timeout=_HEARTBEAT_S)
            except TimeoutError:
                await resp.write(b": keep-alive\n\n")
                continue
            if item is None:
                break
            kind, payload = item
            if kind == "counts" and prefix:
                payload = [r for r in payload if r[0].startswith(prefix)]
                if not payload:
                    continue
            await resp.write(_sse(kind, payload))
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        state.subscribers.discard(queue)
    return resp


def make_dashboard_app(
    settings: Any = None, *, config: DashboardConfig | None = None, domain: Any = None
) -> web.Application:
    """The dashboard sub-application.

    ``settings``: an ``agents.config.settings.Settings`` (broker and topic names) and, when given, its
    loaded ``domain`` (the charts then show the budget per event too); or pass ``config``
    directly (standalone use, tests). With neither, settings are loaded from the environment.
    """
    if config is None:
        if settings is None:
            from agents.config.settings import Settings

            settings = Settings.load()
        config = DashboardConfig.from_settings(settings)
        if domain is not None:
            from dataclasses import replace

            config = replace(config, budget_units=budget_units(domain))
    app = web.Application()
    app[CONFIG_KEY] = config
    app[STATE_KEY] = DashboardState(history=config.history)
    if config.budget_units:
        app[STATE_KEY].budget_units = [[u, k] for u, k in config.budget_units]
    app.router.add_get("/", _index)
    app.router.add_get("/events", _events)
    app.router.add_get("/api/snapshot", _snapshot)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)
    app.cleanup_ctx.append(_consumer_ctx)
    app.on_shutdown.append(_on_shutdown)
    return app
