"""Many codec streams through one CodecDecoder (model/codec.py): `CodecSlots` keeps their state in one tensor,
a row per stream, and decodes a group for several of them in one call, its call shapes captured as CUDA graphs.

Serving-time batching, apart from the decoder itself: the codec worker (codec_worker.py) drives it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .codec import CodecDecoder, CodecStream, SnakeBeta, Tensor, with_context
from .layers import rms_norm, rope_tables


class CodecSlots:
    """Many streams through one CodecDecoder: their state in one preallocated tensor, a row (slot) per stream.

    `open` takes a slot (fresh, or in a CodecStream's state: a cloned voice's context), `decode` continues several
    slots by a group of n frames each in one call, `close` gives the slot back.  A row holds, flattened side by side,
    every stateful conv's left context [channels, keep] and every transformer layer's rotated keys and values
    [kv_heads, window-1, head_dim].  The cache always spans window-1 positions, zeros masked out until a stream has
    that many, so rows at different positions stack.  A call gathers its rows once (index_select), the layers read
    and rewrite their parts of that copy as they do a CodecStream's, and one index_copy_ puts them back: two launches
    for the state whatever the batch.  Rows decode as they would alone (row-independent ops), up to the rounding of
    batched kernels.  Not thread-safe: one thread decodes.  A call that raises before its last launch leaves its
    slots as they were.
    """

    def __init__(self, decoder: CodecDecoder, slots: int) -> None:
        self.decoder = decoder
        cfg = decoder.cfg
        self.keep = cfg.sliding_window - 1  # cached positions a layer keeps
        self._kv_shape = (cfg.num_key_value_heads, self.keep, cfg.head_dim)
        self._convs: dict[object, tuple[int, int, int]] = {}  # conv layer -> (offset in a row, channels, keep)
        width = 0
        for conv in decoder._stateful_convs():
            self._convs[conv] = (width, conv.channels, conv.keep)
            width += conv.channels * conv.keep
        kv = cfg.num_key_value_heads * self.keep * cfg.head_dim
        self._kv = [(width + 2 * i * kv, width + (2 * i + 1) * kv) for i in range(len(decoder.layers))]  # K, V offsets
        self._kv_size = kv
        self.width = width + 2 * kv * len(decoder.layers)
        # One row more than the slots: the padding rows of a call write their state there, never read.
        self.state = torch.zeros(slots + 1, self.width, dtype=decoder.dtype, device=decoder.device)
        self.frames = [0] * slots  # per slot: frames decoded == RoPE position of its next frame
        self._free = list(range(slots))
        # Captured calls, by (padded batch, frames): a replay is one launch where an eager call issues ~670 small
        # kernels from Python, contending for the GIL with the scheduler and the request threads.
        self._graphs: dict[tuple[int, int], _CodecGraph] = {}
        self._pool: torch.cuda._POOL_HANDLE | None = None

    @property
    def capacity(self) -> int:
        return self.state.shape[0] - 1

    @property
    def _spare(self) -> int:
        """The row the padding rows of a call write to."""
        return self.state.shape[0] - 1

    @property
    def graphs(self) -> int:
        """Call shapes captured (capture())."""
        return len(self._graphs)

    def in_use(self) -> int:
        return self.capacity - len(self._free)

    @torch.inference_mode()
    def open(self, start: CodecStream | None = None) -> int:
        """A slot for a new stream, fresh or in `start`'s state; with every slot taken the state grows (doubles)."""
        if not self._free:
            grown = self.capacity
            self.state = torch.cat([self.state[:grown], torch.zeros_like(self.state)])
            self.frames += [0] * grown
            self._free = list(range(grown, 2 * grown))
            self._graphs.clear()  # they read and write the old tensor; calls run eagerly until captured again
        slot = self._free.pop(0)
        row = self.state[slot]
        row.zero_()
        self.frames[slot] = 0
        if start is not None:
            self._load(row, start)
            self.frames[slot] = start.frames
        return slot

    def close(self, slot: int) -> None:
        """Give a slot back (its row is cleared when it is opened again)."""
        self._free.append(slot)

    def _load(self, row: Tensor, start: CodecStream) -> None:
        for conv, (off, channels, keep) in self._convs.items():
            tail = start._tails.get(conv)
            if tail is not None:
                row[off : off + channels * keep].view(channels, keep).copy_(tail[0])
        for (k_off, v_off), past in zip(self._kv, start._kv):
            if past is not None:  # a stream keeps its last min(frames, keep) positions: they end the window
                held = past[0].shape[2]
                row[k_off : k_off + self._kv_size].view(self._kv_shape)[:, self.keep - held :].copy_(past[0][0])
                row[v_off : v_off + self._kv_size].view(self._kv_shape)[:, self.keep - held :].copy_(past[1][0])

    @torch.inference_mode()
    def decode(self, slots: list[int], codes: np.ndarray) -> Tensor:
        """codes [B, n, 16] (host integers) for slots[0..B) -> float32 waveforms [B, n*1920], each continuing its
        slot's stream.  Queued on the current stream; the result is not waited for."""
        dec = self.decoder
        nq = dec.cfg.num_quantizers
        b = len(slots)
        if codes.ndim != 3 or codes.shape[0] != b or codes.shape[2] != nq or len(set(slots)) != b:
            raise ValueError(
                f"codec slots expect codes [{b}, frames, {nq}] for {b} distinct slots, "
                f"got {tuple(codes.shape)} for slots {slots}"
            )
        n = codes.shape[1]
        if n == 0 or b == 0:
            return torch.zeros(b, 0, dtype=torch.float32, device=dec.device)
        # One host-to-device copy carries the codes, the rows to read and write, and their positions.  The batch is
        # padded to a power of two with copies of row 0 whose state goes to the spare row: a (batch, frames) shape's
        # first call costs ~200 ms more than the next (cuDNN's per-shape setup, allocations; on the H200 the codec took
        # 250-470 ms in a first wave of arrivals, ~40 ms when the same load came again), so calls keep to a few
        # shapes, which warm_up() meets (and captures) before the first request.
        padded = padded_rows(b)
        host = np.empty((padded, n * nq + 3), dtype=np.int64)
        host[:b, :-3] = codes.reshape(b, -1)
        host[:b, -3] = slots  # the rows read
        host[:b, -2] = slots  # the rows written
        host[:b, -1] = [self.frames[s] for s in slots]
        host[b:] = host[0]
        host[b:, -2] = self._spare
        packed = torch.from_numpy(host)
        if dec.device.type == "cuda":
            packed = packed.pin_memory()  # so the copy does not wait for the host, nor the host for the GPU
        graph = self._graphs.get((padded, n))
        if graph is not None:
            graph.packed.copy_(packed, non_blocking=True)
            graph.cuda_graph.replay()
            wav = graph.wav[:b].clone()  # the graph's output is overwritten by its next replay
        else:
            wav = self._run(packed.to(dec.device, non_blocking=True), n)[:b]
        for s in slots:
            self.frames[s] += n
        return wav

    def _run(self, packed: Tensor, n: int) -> Tensor:
        """One call on device inputs (decode's packed rows): every row's waveform, its state written last, so that
        a call which raises changes no slot.  What a captured call replays."""
        dec = self.decoder
        nq = dec.cfg.num_quantizers
        read, write, first = packed[:, -3], packed[:, -2], packed[:, -1]
        rows = SlotRows(self, self.state.index_select(0, read))
        x = dec.pre_conv(dec._dequantize(packed[:, :-3].unflatten(1, (n, nq))), rows)
        x = self._transformer(x.transpose(1, 2), rows, first).transpose(1, 2)
        wav = dec._upsample_and_vocode(x, rows)[:, 0].float()
        self.state.index_copy_(0, write, rows.data)
        return wav

    @torch.inference_mode()
    def warm_up(self, frames: Iterable[int], most_rows: int, capture: bool = False) -> int:
        """Decode zeros once at every padded batch size up to most_rows and every group length in `frames`, on
        slots opened for it and closed again, so a request's first call at those shapes is not the first there;
        with `capture` (CUDA only) also capture each shape's call, which later calls replay.  Returns the number
        of shapes."""
        shapes = 0
        for rows in sorted({padded_rows(b) for b in range(1, most_rows + 1)}):
            # As few streams as make `rows` (a call pads them to it), so no more slots open than calls can use.
            ids = [self.open() for _ in range(min(rows, most_rows))]
            try:
                for n in sorted(set(frames)):
                    self.decode(ids, np.zeros((len(ids), n, self.decoder.cfg.num_quantizers), dtype=np.int64))
                    if capture:
                        self._capture(rows, n)
                    shapes += 1
            finally:
                for slot in ids:
                    self.close(slot)
        return shapes

    def _capture(self, rows: int, n: int) -> None:
        """Capture the call for `rows` padded rows of n frames (after an eager call at that shape: cuDNN and the
        allocator have met it).  The calls share one memory pool: they run one after another on one stream."""
        dec = self.decoder
        if dec.device.type != "cuda" or (rows, n) in self._graphs:
            return
        packed = torch.zeros((rows, n * dec.cfg.num_quantizers + 3), dtype=torch.int64, device=dec.device)
        packed[:, -3:-1] = self._spare  # any valid row: a capture launches nothing
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the scheduler's and request threads' CUDA calls are theirs, not this capture's.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            wav = self._run(packed, n)
        self._graphs[(rows, n)] = _CodecGraph(graph, packed, wav)

    def _transformer(self, x: Tensor, rows: SlotRows, first: Tensor) -> Tensor:
        """x [B, n, latent], row r's frames at positions first[r].. : each row attends to its own cached window."""
        dec, cfg = self.decoder, self.decoder.cfg
        b, n = x.shape[:2]
        pos = first[:, None] + torch.arange(n, device=first.device)  # [B, n]
        cos, sin = rope_tables(pos.flatten(), cfg.head_dim, cfg.rope_theta, dec.dtype)
        cos, sin = cos.view(b, 1, n, -1), sin.view(b, 1, n, -1)
        # Key j of a row is at position first - keep + j; the query at q sees it iff q - window < k <= q, and only
        # if the stream has been there (k >= 0: the zeros before a young stream's start are not keys).
        kpos = (first[:, None] - self.keep + torch.arange(self.keep + n, device=first.device))[:, None, :]
        q = pos[:, :, None]
        mask = ((kpos <= q) & (kpos > q - cfg.sliding_window) & (kpos >= 0))[:, None]  # [B, 1, n, keep + n]
        h = F.linear(x, dec.in_proj, dec.in_proj_b)
        for i, layer in enumerate(dec.layers):
            past = rows.kv(i)
            h, (k, v) = layer(h, cos, sin, mask, past)
            past[0].copy_(k[:, :, n:])
            past[1].copy_(v[:, :, n:])
        h = rms_norm(h, dec.final_norm, cfg.rms_norm_eps)
        return F.linear(h, dec.out_proj, dec.out_proj_b)


@dataclass
class _CodecGraph:
    """One captured CodecSlots call: its input buffer (decode's packed rows), the graph, its output waveforms."""

    cuda_graph: torch.cuda.CUDAGraph
    packed: Tensor
    wav: Tensor


def padded_rows(b: int) -> int:
    """The batch a CodecSlots call of b streams runs at: the next power of two."""
    return 1 << max(b - 1, 0).bit_length()


class SlotRows:
    """The gathered rows [B, width] of one CodecSlots.decode call: what the layers see in place of a CodecStream."""

    def __init__(self, slots: CodecSlots, data: Tensor) -> None:
        self.slots, self.data = slots, data

    def _left_context(self, layer: object, x: Tensor, keep: int, act: SnakeBeta | None = None) -> Tensor:
        """CodecStream._left_context for B rows: prepend each row's context to act(x), then overwrite it with the
        new one."""
        if keep == 0:
            return x if act is None else act(x)
        off, channels, _ = self.slots._convs[layer]
        tail = self.data[:, off : off + channels * keep].unflatten(1, (channels, keep))
        x = with_context(tail, x, act)
        tail.copy_(x[..., x.shape[-1] - keep :])
        return x

    def kv(self, i: int) -> tuple[Tensor, Tensor]:
        """Layer i's cached keys and values, views [B, kv_heads, keep, head_dim] into the rows."""
        k_off, v_off = self.slots._kv[i]
        size, shape = self.slots._kv_size, self.slots._kv_shape
        return (
            self.data[:, k_off : k_off + size].unflatten(1, shape),
            self.data[:, v_off : v_off + size].unflatten(1, shape),
        )
