"""A transactional producer that refuses to commit a transaction with a failed record.

See :class:`_CheckedProducer` for why aiokafka's own commit is not enough.
"""

from __future__ import annotations

import asyncio
from typing import Any


class TransactionRecordFailed(RuntimeError):
    """Records of a transaction could not be written (e.g. larger than the topic allows);
    ``causes`` holds their errors."""

    def __init__(self, message: str, causes: list[BaseException]) -> None:
        super().__init__(message)
        self.causes = causes


class _CheckedProducer:
    """A transactional aiokafka producer that commits only if every record of the transaction
    was written.

    aiokafka commits a transaction even when one of its records failed for good (measured: a
    record above the topic's ``max.message.bytes`` is dropped with ``MessageSizeTooLargeError``
    on its delivery future, and ``commit_transaction`` still succeeds with the others). A release
    or checkpoint silently missing from a committed transaction would break "a tick is released
    once": every delivery future is awaited before the commit, and any failure raises
    :class:`TransactionRecordFailed` instead (the stage aborts and recovers).
    """

    def __init__(self, producer: Any) -> None:
        self._p = producer
        self._futures: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._p, name)

    async def begin_transaction(self) -> None:
        self._futures = []
        await self._p.begin_transaction()

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        fut = await self._p.send(*args, **kwargs)
        self._futures.append(fut)
        return fut

    async def send_batch(self, *args: Any, **kwargs: Any) -> Any:
        fut = await self._p.send_batch(*args, **kwargs)
        self._futures.append(fut)
        return fut

    async def commit_transaction(self) -> None:
        futures, self._futures = self._futures, []
        if futures:
            await self._p.flush()
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise TransactionRecordFailed(
                    f"{len(failed)} of {len(futures)} records of the transaction were not "
                    f"written ({type(failed[0]).__name__}: {failed[0]}); not committing", failed)
        await self._p.commit_transaction()

    async def abort_transaction(self) -> None:
        futures, self._futures = self._futures, []
        for fut in futures:  # retrieved: no "exception was never retrieved" noise
            if fut.done() and not fut.cancelled():
                fut.exception()
        await self._p.abort_transaction()
