"""One ``async with`` protocol for what is closed on the way out of a block.

The upstream client, the mock provider and a quota reservation are all used as ``async with x:``
and left by closing; only what leaving by an exception does differs (by default: close too).
Standard library only, so every floor above may use it."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClosing:
    """``async with`` gives the object itself and closes it on the way out: :meth:`close` when
    the block ends normally, :meth:`close_on_error` when an exception (a cancellation included)
    leaves it."""

    __slots__ = ()  # a slotted subclass stays slotted

    async def close(self) -> None:
        raise NotImplementedError

    async def close_on_error(self) -> None:
        """Leaving by an exception; closing as usual unless overridden."""
        await self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.close_on_error()
