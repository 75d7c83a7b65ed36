"""A TCP relay for the TLS tests: ``python -m tests.integration._relay LISTEN TO [CERT KEY]``.

Listens on ``LISTEN`` (host:port) and pipes every connection to ``TO`` (host:port). With a
certificate and key it terminates TLS on the listening side (a stand-in for a TLS listener of a
real Kafka cluster, in front of the embedded broker, which speaks plaintext only). Prints
``ready`` once listening; stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def main(listen: str, to: str, cert: str | None, key: str | None) -> None:
    lhost, lport = listen.rsplit(":", 1)
    thost, tport = to.rsplit(":", 1)
    ctx = None
    if cert and key:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(thost, int(tport))
        except OSError:
            w.close()
            return
        await asyncio.gather(_pipe(r, uw), _pipe(ur, w))

    server = await asyncio.start_server(handle, lhost, int(lport), ssl=ctx)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], *(args[2:4] if len(args) >= 4 else (None, None))))
