"""The K/V of voices' prompt prefixes (model/prompt.py, PromptPrefix), kept to skip prefilling them again.

A prefix's K/V depend only on its positions (attention is causal), so a request whose prompt starts with a
cached prefix copies them into its cache and prefills only the rest: fewer positions through the Talker per
request, which pays where the prefill's arithmetic, not its weight reads, is the cost (long instructs and
transcripts, many arrivals at once). Entries are keyed by what fixes the positions (voice, language,
instruct), so a voice that changes (a new clip under the same name) gets a new key; the old entry is never
hit again and ages out. Least recently used entries go first once the entries' bytes pass the bound.
"""

from __future__ import annotations

from torch import Tensor

from .lru import BoundedLru
from .prompt import PromptPrefix


class PrefixCache(BoundedLru[Tensor]):
    """Prefix K/V by PromptPrefix.key, at most `max_bytes` in all (least recently used dropped first).

    One cache belongs to one model's backend: an entry is [layers, 2, P, kv_heads, head_dim] in that
    backend's KV layout, on its device. Thread-safe (the engine's request threads and the scheduler).
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, lambda kv: kv.numel() * kv.element_size())

    def kv_for(self, prefix: PromptPrefix) -> Tensor | None:
        """The prefix's K/V ([layers, 2, prefix.length, ...]), or None (counted as a miss)."""
        return self.get(prefix.key, lambda kv: kv.shape[2] == prefix.length)

    def keep(self, prefix: PromptPrefix, cache_data: Tensor) -> None:
        """Keep a copy of positions [0, prefix.length) of a prefilled cache ([layers, 2, max_seq, ...]); an entry
        larger than the whole bound is not kept (nor copied)."""
        if cache_data[:, :, : prefix.length].numel() * cache_data.element_size() > self.max_bytes:
            return
        self.put(prefix.key, cache_data[:, :, : prefix.length].clone())
