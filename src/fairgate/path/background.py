"""Bookkeeping run off the response path: the tasks still running, for shutdown to wait for.

One place for what the request path's services and the shared slot releases both do: start a
task, forget it once done, and wait until none is left (a task may start another)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    """The tasks started here and not finished yet; their failures are theirs to log."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in a task of its own, held until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait until no task is left, those the finishing ones start included."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
