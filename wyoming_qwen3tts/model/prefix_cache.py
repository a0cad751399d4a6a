"""The K/V of voices' prompt prefixes (model/prompt.py, PromptPrefix), kept to skip prefilling them again.

A prefix's K/V depend only on its positions (attention is causal), so a request whose prompt starts with a
cached prefix copies them into its cache and prefills only the rest: fewer positions through the Talker per
request, which pays where the prefill's arithmetic, not its weight reads, is the cost (long instructs and
transcripts, many arrivals at once). Entries are keyed by what fixes the positions (voice, language,
instruct), so a voice that changes (a new clip under the same name) gets a new key; the old entry is never
hit again and ages out. Least recently used entries go first once the entries' bytes pass the bound.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from torch import Tensor

from .prompt import PromptPrefix


class PrefixCache:
    """Prefix K/V by PromptPrefix.key, at most `max_bytes` in all (least recently used dropped first).

    One cache belongs to one model's backend: an entry is [layers, 2, P, kv_heads, head_dim] in that
    backend's KV layout, on its device. Thread-safe (the engine's request threads and the scheduler).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[object, ...], Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, prefix: PromptPrefix) -> Tensor | None:
        """The prefix's K/V ([layers, 2, prefix.length, ...]), or None (counted as a miss)."""
        with self._lock:
            kv = self._entries.get(prefix.key)
            if kv is None or kv.shape[2] != prefix.length:
                self.misses += 1
                return None
            self._entries.move_to_end(prefix.key)
            self.hits += 1
            return kv

    def put(self, prefix: PromptPrefix, cache_data: Tensor) -> None:
        """Keep a copy of positions [0, prefix.length) of a prefilled cache ([layers, 2, max_seq, ...]); an entry
        larger than the whole bound is not kept."""
        size = cache_data[:, :, : prefix.length].numel() * cache_data.element_size()
        if size > self.max_bytes:
            return
        kv = cache_data[:, :, : prefix.length].clone()
        with self._lock:
            old = self._entries.pop(prefix.key, None)
            if old is not None:
                self.bytes -= old.numel() * old.element_size()
            self._entries[prefix.key] = kv
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self.bytes -= dropped.numel() * dropped.element_size()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0
