"""A least-recently-used map bounded in bytes (and, optionally, entries), thread-safe: the prompt caches' core."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class BoundedLru(Generic[V]):
    """Values by key, at most `max_bytes` of them (as `size` counts) and `max_entries` (None: no bound), the least
    recently used dropped first; a value larger than the whole bound is not kept. Counts hits and misses."""

    def __init__(self, max_bytes: int, size: Callable[[V], int], max_entries: int | None = None) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._size = size
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, valid: Callable[[V], bool] | None = None) -> V | None:
        """The value (now the most recently used), or None, counted as a miss: absent, or not `valid`."""
        with self._lock:
            value = self._entries.get(key)
            if value is None or (valid is not None and not valid(value)):
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: V) -> None:
        size = self._size(value)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= self._size(old)
            self._entries[key] = value
            self.bytes += size
            while self.bytes > self.max_bytes or (
                self.max_entries is not None and len(self._entries) > self.max_entries
            ):
                _, dropped = self._entries.popitem(last=False)
                self.bytes -= self._size(dropped)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0
