"""Produce requests sent with one copy of their record batches, not eight.

aiokafka encodes a request by nesting: each ``Schema`` and ``Array`` level returns
``b"".join`` of its fields, and ``Bytes`` prepends its length with ``+`` — so a produce
request's record batch (the worker's compact records and histogram chunks: ≈ 40 MB per tick
at 10^6 streams) is copied once per level, six times, and the connection's ``send`` copies it
twice more (header + body, size + message). Each copy of a multi-MB batch is a fresh
allocation whose pages fault in: 9.4 ms per 4 MB request against 0.2 ms for one join
(measured; benchmarks/RESULTS.md). :func:`install` replaces the ``encode`` of aiokafka's
produce request classes with one that walks the same schema, collects the pieces (the batches
themselves, not copies) and joins them once, and makes the connection send a produce request
as size, header and those pieces joined once: the same bytes on the wire (unit tests compare
them with aiokafka's own encoding for every produce version). Other requests are untouched.
aiokafka is pinned (pyproject.toml); the patched ``send`` is aiokafka 0.14's with the one join.
"""

from __future__ import annotations

from typing import Any

__all__ = ["encode_flat", "frame", "install"]

_state: dict[str, Any] = {"installed": False, "originals": {}}


def _pieces(typ: Any, value: Any, out: list[Any]) -> None:
    from aiokafka.protocol.types import Array, Bytes, Int32, Schema

    if isinstance(typ, Schema):
        if len(value) != len(typ.fields):
            raise ValueError("Item field count does not match Schema")
        for i, field in enumerate(typ.fields):
            _pieces(field, value[i], out)
    elif type(typ) is Array:  # not a subclass: CompactArray encodes its length otherwise
        if value is None:
            out.append(Int32.encode(-1))
            return
        out.append(Int32.encode(len(value)))
        for item in value:
            _pieces(typ.array_of, item, out)
    elif typ is Bytes:
        if value is None:
            out.append(Int32.encode(-1))
        else:
            out.append(Int32.encode(len(value)))
            out.append(value)
    else:
        out.append(typ.encode(value))


def encode_flat(request: Any) -> bytes:
    """``request.encode()`` (an aiokafka ``Struct``) with every leaf piece joined once."""
    out: list[Any] = []
    schema = request.SCHEMA
    _pieces(schema, [request.__dict__[name] for name in schema.names], out)
    return b"".join(out)


def _plain(typ: Any) -> bool:
    """Only Schema / Array / Bytes / fixed types: what :func:`_pieces` encodes as aiokafka."""
    from aiokafka.protocol.types import (
        AbstractType,
        Array,
        Bytes,
        Int16,
        Int32,
        Int64,
        Schema,
        String,
    )

    if isinstance(typ, Schema):
        return all(_plain(f) for f in typ.fields)
    if type(typ) is Array:
        return _plain(typ.array_of)
    if isinstance(typ, String):
        return True
    return isinstance(typ, type) and issubclass(typ, AbstractType) and typ in (
        Bytes, Int16, Int32, Int64)


def frame(request_struct: Any, header: Any) -> bytes:
    """What aiokafka's connection writes for a request: ``size + header + body``, joined once
    (``size`` = the byte length of header and body, big-endian int32)."""
    import struct

    out: list[Any] = [b"", header.encode()]
    schema = request_struct.SCHEMA
    _pieces(schema, [request_struct.__dict__[name] for name in schema.names], out)
    out[0] = struct.pack(">i", sum(memoryview(p).nbytes for p in out))
    return b"".join(out)


def install() -> bool:
    """Patch aiokafka's produce request classes and its connection's ``send`` (idempotent).
    Returns whether any class was (a version whose schema holds other types keeps aiokafka's
    encoding and its send)."""
    if _state["installed"]:
        return bool(_state["originals"])
    _state["installed"] = True
    from aiokafka.protocol import produce

    for name in dir(produce):
        cls: Any = getattr(produce, name)
        if not (name.startswith("ProduceRequest_v") and isinstance(cls, type)):
            continue
        if "encode" in cls.__dict__ or not _plain(getattr(cls, "SCHEMA", None)):
            continue
        _state["originals"][cls] = cls.encode  # type: ignore[attr-defined]
        setattr(cls, "encode", encode_flat)  # noqa: B010 - a class attribute patched
    if _state["originals"]:
        _install_send()
    return bool(_state["originals"])


def _install_send() -> None:
    import aiokafka.errors as errors
    from aiokafka import conn

    original = conn.AIOKafkaConnection.send
    flat = tuple(_state["originals"])

    def send(self: Any, request: Any, expect_response: bool = True) -> Any:
        if self._writer is None:
            return original(self, request, expect_response)
        request_struct = request.prepare(self._versions)
        if type(request_struct) not in flat:
            return original(self, request, expect_response)  # prepare() is pure: again
        correlation_id = self._next_correlation_id()
        header = request_struct.build_request_header(
            correlation_id=correlation_id, client_id=self._client_id)
        message = frame(request_struct, header)
        try:
            self._writer.write(message)
        except OSError as err:
            self.close(reason=conn.CloseReason.CONNECTION_BROKEN)
            raise errors.KafkaConnectionError(
                f"Connection at {self._host}:{self._port} broken: {err}") from err
        if not expect_response:
            return self._writer.drain()
        fut = self._loop.create_future()
        self._requests.append((correlation_id, request_struct, fut))
        return conn.wait_for(fut, self._request_timeout)

    conn.AIOKafkaConnection.send = send
