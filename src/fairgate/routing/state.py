"""The little memory some strategies keep between requests, bounded.

- round-robin: a turn counter per combo;
- strict-random: a shuffled deck per combo (every target once per cycle, in random order);
- cache-optimized and auto's affinity factor: the target each (combo, session) last succeeded
  on, so a conversation returns to the upstream that holds its prompt cache.

One ``StrategyState`` serves the whole process. Each map is an LRU (``OrderedDict``) with a cap,
so a flood of combos or session ids cannot grow memory without bound; losing an entry only
costs a rotation restart or a cold cache, never correctness.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from typing import TypeVar

from fairgate.routing.model import Target

__all__ = ["StrategyState"]

K = TypeVar("K")
V = TypeVar("V")


def _put(store: OrderedDict[K, V], key: K, value: V, cap: int) -> None:
    store[key] = value
    store.move_to_end(key)
    while len(store) > cap:
        store.popitem(last=False)


class StrategyState:
    __slots__ = ("_affinity", "_decks", "_max_combos", "_max_sessions", "_turns")

    def __init__(self, *, max_combos: int = 1_024, max_sessions: int = 10_000) -> None:
        if max_combos < 1 or max_sessions < 1:
            raise ValueError("max_combos and max_sessions must be ≥ 1")
        self._max_combos = max_combos
        self._max_sessions = max_sessions
        self._turns: OrderedDict[str, int] = OrderedDict()
        self._decks: OrderedDict[str, tuple[frozenset[str], list[str]]] = OrderedDict()
        self._affinity: OrderedDict[tuple[str, str], str] = OrderedDict()

    def next_turn(self, combo: str) -> int:
        """0, 1, 2, … per combo: one call per request."""
        turn = self._turns.get(combo, 0)
        _put(self._turns, combo, turn + 1, self._max_combos)
        return turn

    def draw(self, combo: str, keys: Sequence[str], rng: random.Random) -> str:
        """The next key from the combo's deck; a fresh shuffle when the deck is empty or the
        combo's targets changed."""
        wanted = frozenset(keys)
        entry = self._decks.get(combo)
        if entry is None or entry[0] != wanted or not entry[1]:
            deck = list(keys)
            rng.shuffle(deck)
            deck.reverse()  # pop() from the end = the shuffled order's front
            entry = (wanted, deck)
        key = entry[1].pop()
        _put(self._decks, combo, entry, self._max_combos)
        return key

    def session_target(self, combo: str, session_key: str | None) -> str | None:
        """The target key this session last succeeded on in this combo."""
        if session_key is None:
            return None
        return self._affinity.get((combo, session_key))

    def note_success(self, combo: str, session_key: str | None, target: Target) -> None:
        """The executor calls this when ``target`` answered the session's request."""
        if session_key is not None:
            _put(self._affinity, (combo, session_key), target.key, self._max_sessions)

    def release(self, combo: str, session_key: str | None, target_key: str) -> None:
        """Forget the session's pin to ``target_key`` (its answer failed a check): the next
        request of the session is not sent back to it by affinity."""
        if session_key is not None and self._affinity.get((combo, session_key)) == target_key:
            del self._affinity[(combo, session_key)]

    def forget_combo(self, combo: str) -> None:
        self._turns.pop(combo, None)
        self._decks.pop(combo, None)
        for k in [k for k in self._affinity if k[0] == combo]:
            del self._affinity[k]

    def sizes(self) -> tuple[int, int, int]:
        """(turn counters, decks, session affinities) held — for tests and the dashboard."""
        return len(self._turns), len(self._decks), len(self._affinity)
