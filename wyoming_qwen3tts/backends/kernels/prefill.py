"""The prompt prefill for the kernel backend: the torch Talker over the prompt into the KV cache the
kernels then read, replayed as one captured CUDA/HIP graph per bucket length (Transformer.
prefill_bucketed's bucketing) instead of ~1,700 small launches issued from Python.

A graph writes cache positions 0..bucket-1 (the pads' K/V past the prompt are overwritten by the
decode steps before the attention kernel reads them) and `hn`, the final-normed hidden state of the
prompt's last position, gathered through a device index so one graph serves every length in its
bucket. Longer prompts, buckets past the cache, and runtimes that cannot capture run eagerly.

With a prefix cache (model/prefix_cache.py), a prompt whose voice prefix is cached gets the prefix's K/V copied
into the cache and only the positions after it prefilled: Transformer.prefill_after, whose start is a device
value, so one more graph per bucket serves every prefix length (captured with the others at warm-up). A missed
prefix is stored after a whole prefill.

With int8 weights (model/quant.py) the Talker's QuantLinears dequantize each matrix into a temporary as
they run, in the graph as eagerly: the replay recomputes it from the int8 weights (they never move), so the
graphs stay correct, at the cost of that work per prefill and the largest temporaries in the graphs' pool
(docs/int8.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from ...model.prefix_cache import PrefixCache
from ...model.prompt import PromptPrefix
from ...model.talker import PREFILL_BUCKETS, KVCache, Transformer, prefill_bucket

_LOGGER = logging.getLogger(__name__)

# Buckets captured at start-up (warm_up): prompts of up to this many positions (a one-sentence request
# is ~30, a 600-character paragraph ~160) never wait for a capture.
WARM_PREFILL_POSITIONS = 256


class PrefillGraphs:
    """Prefills `talker` into a cache and `hn`, through captured graphs where it can."""

    def __init__(
        self,
        talker: Transformer,
        hn: Tensor,
        dtype: torch.dtype,
        *,
        enabled: bool = True,
        prefixes: PrefixCache | None = None,
    ) -> None:
        self.talker = talker
        self.hn = hn  # float32 [H], read by the decode graph
        self.enabled = enabled
        self.prefixes = prefixes  # voices' prefix K/V (None: every prompt prefilled whole)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # bucket -> graph
        self.after_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # bucket -> graph of a prefill after a prefix
        self._start = torch.zeros(1, dtype=torch.int64, device=hn.device)  # where such a prefill starts
        self._cache: KVCache | None = None  # the cache the graphs write (they are re-captured for a new one)
        self._x = torch.zeros(PREFILL_BUCKETS[-1], hn.shape[0], dtype=dtype, device=hn.device)  # static input
        self._last = torch.zeros(1, dtype=torch.int64, device=hn.device)  # prompt length - 1
        self._pool: torch.cuda._POOL_HANDLE | None = None  # one memory pool for all prefill graphs
        self._stream: torch.cuda.Stream | None = None  # their warm-up and capture stream

    def prefill(
        self, embeds: Tensor, cache: KVCache, prefix: PromptPrefix | None = None, *, capture: bool = True
    ) -> None:
        """cache <- the prompt's K/V (cache.length = its length), hn <- its last hidden state. `prefix`: the
        prompt's voice prefix, whose K/V come from the prefix cache where they are there (and the graph of the rest
        is captured, or may be: `capture`), and are stored there after a whole prefill otherwise."""
        if prefix is not None and self.prefixes is not None and self._prefill_after(embeds, cache, prefix, capture):
            return
        bucket = prefill_bucket(embeds.shape[0], cache.max_seq) if self.enabled else None
        if bucket is None or not self._replay(embeds, cache, bucket):
            cache.reset()
            self.hn.copy_(self.talker(embeds.to(self._x.dtype), cache)[-1])
        if prefix is not None and self.prefixes is not None:
            self.prefixes.keep(prefix, cache.data)

    def _prefill_after(self, embeds: Tensor, cache: KVCache, prefix: PromptPrefix, capture: bool) -> bool:
        """The prompt after its cached prefix (copied in), through the bucket's graph of Transformer.prefill_after
        (eagerly where graphs are off or the rest fits no bucket); False when the prefix is not cached, or its graph
        is not captured and may not be now."""
        start = prefix.length
        rest = embeds[start:]
        n = rest.shape[0]
        bucket = prefill_bucket(n, cache.max_seq - start)
        graphed = self.enabled and bucket is not None
        if graphed and not capture and not (self._cache is cache and bucket in self.after_graphs):
            return False
        kv = self.prefixes.kv_for(prefix) if self.prefixes is not None else None
        if kv is None:
            return False
        cache.data[:, :, :start].copy_(kv)
        if graphed:
            assert bucket is not None
            if self._replay(rest, cache, bucket, after=start):
                return True
        cache.length = start  # eagerly: forward() appends from there
        self.hn.copy_(self.talker(rest.to(self._x.dtype), cache)[-1])
        return True

    def captured(self, length: int, cache: KVCache) -> bool:
        """Whether a prompt of `length` positions into `cache` replays a graph captured already (no
        capture, no eager run): what the batched decoder asks before it admits through these graphs."""
        bucket = prefill_bucket(length, cache.max_seq) if self.enabled else None
        return bucket is not None and self._cache is cache and bucket in self.graphs

    def warm_up(self, cache: KVCache, max_positions: int = WARM_PREFILL_POSITIONS) -> int:
        """Capture the graphs of every bucket up to `max_positions` now (a capture costs tens of
        milliseconds, paid here instead of by the first request of each length), and with a prefix cache
        those of prefills after a prefix too. Writes the cache and hn. Returns how many graphs were captured."""
        if not self.enabled:
            return 0
        before = len(self.graphs) + len(self.after_graphs)
        for bucket in PREFILL_BUCKETS:
            if bucket > min(max_positions, cache.max_seq):
                break
            zeros = self._x.new_zeros(bucket, self._x.shape[1])
            if self._cache is not cache or bucket not in self.graphs:
                if not self._replay(zeros, cache, bucket):
                    return 0  # capture does not work here: prefills run eagerly (logged)
            if self.prefixes is not None and bucket not in self.after_graphs and bucket < cache.max_seq:
                if not self._replay(zeros, cache, bucket, after=0):
                    return 0
        return len(self.graphs) + len(self.after_graphs) - before

    def _replay(self, embeds: Tensor, cache: KVCache, bucket: int, after: int | None = None) -> bool:
        """The graph of `bucket` (captured the first time) over the prompt, or with `after`, over the positions
        after a prefix of that length already in the cache; False, after one warning, when the capture fails
        (every prefill then runs eagerly). The caller keeps after + bucket <= the cache's positions."""
        n = embeds.shape[0]
        if self._cache is not cache:  # first use, or the backend grew its cache
            self.graphs.clear()
            self.after_graphs.clear()
            self._cache = cache
            self._pool = None  # the old graphs' pool goes with them
        x = self._x[:bucket]
        x[:n].copy_(embeds)
        x[n:].zero_()
        self._last.fill_(n - 1)
        graphs = self.graphs if after is None else self.after_graphs
        if after is not None:
            self._start.fill_(after)
        graph = graphs.get(bucket)
        if graph is None:
            try:
                body = self._body(cache, bucket) if after is None else self._body_after(cache, bucket)
                graph = self.capture(bucket, body)
            except torch.cuda.OutOfMemoryError:
                raise  # the server's out-of-memory handling takes it from here
            except RuntimeError as err:
                # A runtime that cannot capture these torch ops (a ROCm or driver version, say).
                _LOGGER.warning("Captured prefill failed (%s); prefilling eagerly from now on", err)
                self.enabled = False
                self.graphs.clear()
                self.after_graphs.clear()
                return False
            graphs[bucket] = graph
        graph.replay()
        cache.length = n if after is None else after + n
        return True

    def _body(self, cache: KVCache, bucket: int) -> Callable[[], None]:
        """What the graph of `bucket` holds: the Talker over the static input from position 0, then
        hn = the final-normed row at the device index (prompt length - 1)."""
        x, last, hn, talker = self._x[:bucket], self._last, self.hn, self.talker

        def run() -> None:
            cache.reset()
            hn.copy_(talker.prefill_bucketed(x, cache, bucket, last)[0])  # copy_ casts to float32

        return run

    def _body_after(self, cache: KVCache, bucket: int) -> Callable[[], None]:
        """What the graph of a prefill after a prefix holds: Transformer.prefill_after over the static input from
        the device start, then hn = its final-normed row at the device index."""
        x, start, last, hn, talker = self._x[:bucket], self._start, self._last, self.hn, self.talker

        def run() -> None:
            hn.copy_(talker.prefill_after(x, cache, start, last)[0])

        return run

    def capture(self, bucket: int, run: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """`run` (the body of `bucket`'s graph) captured, after one warm-up run that writes what the
        replay will."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.hn.device)
        return capture_graph(run, self._pool, self._stream)


def capture_graph(
    run: Callable[[], None], pool: torch.cuda._POOL_HANDLE, side: torch.cuda.Stream
) -> torch.cuda.CUDAGraph:
    """`run` captured into `pool` on `side`, after one warm-up run there that writes what the replay will.

    Warm-up on the side stream (cuBLAS handle and its per-stream workspace, lazily loaded kernels), as
    the CUDA-graph docs ask: torch.cuda.graph itself only syncs and empties the allocator cache.
    Capturing on that same stream reuses the workspace made here (outside the graphs' pool); one stream
    for all of a set's graphs makes one workspace, not one per graph. A set's graphs share one pool:
    they keep no live tensors in it (outputs go to static buffers) and replay one at a time on one
    stream, so the pool holds one graph's activations, not all of them."""
    current = torch.cuda.current_stream(side.device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        run()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        run()
    current.wait_stream(side)
    return graph


class BatchedPrefillGraphs:
    """Many prompts prefilled into a slot-major cache (the batched decoder's) in one replay: one graph per
    (rows, bucket), Transformer.prefill_padded over a static input where each prompt is right-padded with
    zeros to the bucket and the rows past the last prompt repeat the first (its slot, its prompt: they
    write what that row writes, bit for bit, since a row of a matmul does not depend on the others).

    Eagerly, 16 arrivals at once cost ~1,700 launches issued from Python on the scheduler thread (~25-40 ms
    of host time contending for the GIL with the codec worker and request threads), then the GPU
    work; a replay is one launch."""

    def __init__(self, talker: Transformer, cache: Tensor, rows: tuple[int, ...], max_positions: int) -> None:
        """rows: the row counts to capture (each <= the cache's slots); max_positions: the largest bucket."""
        self.talker, self.cache, self.rows = talker, cache, rows
        self.max_positions = max_positions
        most = max(rows)
        dev, hidden = cache.device, talker.norm.weight.shape[0]
        self._x = torch.zeros(most, max_positions, hidden, dtype=cache.dtype, device=dev)  # static input
        self._slots = torch.zeros(most, dtype=torch.int64, device=dev)
        self._last = torch.zeros(most, dtype=torch.int64, device=dev)
        self.hn = torch.zeros(most, hidden, dtype=torch.float32, device=dev)  # each row's last hidden state
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._pool: torch.cuda._POOL_HANDLE | None = None
        self._stream: torch.cuda.Stream | None = None

    def shape(self, lengths: list[int]) -> tuple[int, int] | None:
        """The captured (rows, bucket) that prefills prompts of these lengths, or None (run them eagerly)."""
        rows = next((r for r in sorted(self.rows) if r >= len(lengths)), None)
        bucket = prefill_bucket(max(lengths), self.max_positions) if lengths else None
        return (rows, bucket) if rows is not None and bucket is not None and (rows, bucket) in self.graphs else None

    def prefill(self, prompts: list[Tensor], slots: Tensor, last: Tensor, shape: tuple[int, int]) -> Tensor:
        """Replay shape's graph (from shape()) for prompts [L_b, H] into slots (int64 [B], device) whose last
        positions are `last` (int64 [B], device). Returns the rows' final-normed hidden states [B, H] (float32,
        a view of a static buffer: valid until the next replay). Queued on the current stream, no host wait."""
        rows, bucket = shape
        n = len(prompts)
        x = self._x[:rows, :bucket]
        x.zero_()
        for b, p in enumerate(prompts):
            x[b, : p.shape[0]].copy_(p)
        self._slots[:n].copy_(slots)
        self._last[:n].copy_(last)
        if n < rows:  # the spare rows repeat the first: same slot, same prompt, same writes
            x[n:rows].copy_(x[0].expand(rows - n, -1, -1))
            self._slots[n:rows].copy_(slots[:1].expand(rows - n))
            self._last[n:rows].copy_(last[:1].expand(rows - n))
        self.graphs[shape].replay()
        return self.hn[:n]

    def capture_all(self, budget: int) -> int:
        """Capture every (rows, bucket) with rows x bucket <= budget padded positions, writing slots 0..rows-1
        (their streams must not be running). Returns how many graphs were captured."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream(device=self.cache.device)
        assert self._stream is not None
        before = len(self.graphs)
        # Inference mode: with autograd recording, each warm-up run's activations (~5 GiB at 16 x 256 positions
        # of the 1.7B) stay referenced from the static output, one set per graph: out of memory on the H200.
        with torch.inference_mode():
            for rows in self.rows:
                for bucket in PREFILL_BUCKETS:
                    if bucket > self.max_positions or rows * bucket > budget or (rows, bucket) in self.graphs:
                        continue
                    self._x.zero_()
                    self._slots[:rows].copy_(torch.arange(rows, device=self.cache.device))
                    self._last[:rows].fill_(bucket - 1)
                    self.graphs[(rows, bucket)] = capture_graph(self._body(rows, bucket), self._pool, self._stream)
        return len(self.graphs) - before

    def _body(self, rows: int, bucket: int) -> Callable[[], None]:
        x, slots, last = self._x[:rows, :bucket], self._slots[:rows], self._last[:rows]
        hn, talker, cache = self.hn[:rows], self.talker, self.cache

        def run() -> None:
            hn.copy_(talker.prefill_padded(x, cache, slots, last))  # copy_ casts to float32

        return run
