"""A gate between Generate calls and weight swaps (a readers-writer lock with writer preference).

Any number of calls run at once; a swap waits until the calls in flight have finished,
and calls that arrive meanwhile wait until it is done. So every call, and with it every
prompt's group of n samples, is sampled by one weight version.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class SwapGate:
    """`async with gate.call()` around a Generate call; `async with gate.swap()` around a weight swap."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._calls = 0
        self._swapping = False

    @property
    def num_calls(self) -> int:
        return self._calls

    @asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swapping)
            self._calls += 1
        try:
            yield
        finally:
            async with self._cond:
                self._calls -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def swap(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swapping)
            self._swapping = True  # from here on new calls wait
            try:
                await self._cond.wait_for(lambda: self._calls == 0)
            except BaseException:
                self._swapping = False
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            async with self._cond:
                self._swapping = False
                self._cond.notify_all()
