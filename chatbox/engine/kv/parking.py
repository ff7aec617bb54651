"""Conversations' KV parked in host RAM: an LRU of llama.cpp state bytes within a budget."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from chatbox.engine.kv.state import State


@dataclass
class Parked:
    cache_key: str
    tokens: list[int]
    data: State
    scope: str | None = None
    public: int = 0


class ParkedRam:
    """Parked prefixes by cache key; the least recently parked go first past `budget` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.size = 0
        self._items: OrderedDict[str, Parked] = OrderedDict()

    def get(self, key: str) -> Parked | None:
        return self._items.get(key)

    def put(self, item: Parked) -> None:
        """Park item (replacing its key's older state); one bigger than the budget is not kept."""
        if len(item.data) > self.budget:
            return
        self.drop(item.cache_key)
        self._items[item.cache_key] = item
        self.size += len(item.data)
        while self.size > self.budget and self._items:
            _, old = self._items.popitem(last=False)
            self.size -= len(old.data)

    def holds(self, key: str, tokens: list[int], scope: str | None, public: int) -> bool:
        """Whether key is parked with exactly these tokens, scope and public prefix."""
        p = self._items.get(key)
        return p is not None and (p.scope, p.public, p.tokens) == (scope, public, tokens)

    def touch(self, key: str) -> None:
        """Make key the most recently parked (the last to go past the budget)."""
        self._items.move_to_end(key)

    def drop(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.size -= len(old.data)

    def clear(self) -> None:
        self._items.clear()
        self.size = 0

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
