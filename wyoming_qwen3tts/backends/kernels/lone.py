"""A lone stream's step: when one slot of a BatchedDecoder is busy, it runs the batch-1 frame's kernels.

The batched step costs a lone stream ~13 % of its speed (H200, 1.7B: 286 frames/s against 328 on the batch-1
frame): its GEMVs are built for many vectors and take longer per launch at these shapes. This step gives one
slot the batch-1 frame's launch list (frame.py: one-vector GEMVs, both first positions together, the one-stream
attentions) over that slot's own state in the decoder, so a stream moves between this step and the batched one at any frame boundary with nothing
copied: its KV cache block is an ordinary one-stream cache, its position, frame index, seed, penalty set
and history are read where the batched kernels read them. The draw, the code store, the next input's
embedding sum and the counters' advance are the batched kernels at one row (their row is the slot's), so
a lone stream draws exactly as it would in a batch: Philox keyed by its own seed, frame and code index,
its sampling settings from its slot's records.

What differs from the batched step is only the order of float32 sums inside the GEMVs and the Talker
attention (both kernels agree to float32 rounding): a stream's codes may depend on whether it had
batch-mates at some frame, where logits tie to within that rounding. `BatchedDecoder(invariant=True)` (the
`batch_invariant` setting) keeps every stream on the batched step, whose codes never depend on
batch-mates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...model.talker import KVCache
from .frame import NUM_GROUPS, StackBuffers, launch_cp_passes, launch_first_two_positions, launch_layers

if TYPE_CHECKING:
    from .batched import BatchedDecoder


class LoneStep:
    """The batch-1 frame over one slot of `decoder`; one captured graph per slot (capture_all)."""

    def __init__(self, decoder: BatchedDecoder, attn_splits: int, cp_persistent: bool = False) -> None:
        """attn_splits: the Talker attention's chunks per head, as the one-stream backend's (32 fills the GPU
        with one stream's 16 heads); cp_persistent: CodePredictor positions 2..15 in one persistent launch
        (frame.launch_cp_passes, KernelOptions.cp_persistent)."""
        self.cp_persistent = cp_persistent
        d = self.decoder = decoder
        dev, tc, cc = d.model.device, d.tc, d.cc
        # The work buffers are shared by every slot (one lone step runs at a time); the caches are the slot's.
        talker = StackBuffers(tc, d.cache[0], attn_splits, short=False)
        self.talker = [talker.on(d.cache[s]) for s in range(d.slots)]
        self.code_predictor = StackBuffers(cc, KVCache(cc, NUM_GROUPS, d.model.dtype, dev).data, 1, short=True)
        # CodePredictor positions 0 and 1, then the stream.
        self.cx2 = torch.zeros(2, cc.hidden_size, dtype=torch.float32, device=dev)
        self.logits = torch.zeros(1, tc.vocab_size, dtype=torch.float32, device=dev)
        self.cp_logits = torch.zeros(1, cc.vocab_size, dtype=torch.float32, device=dev)
        self.cp_sync = torch.zeros(2, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def launch(self, slot: int, stream: int) -> None:
        """Launch one frame of the stream in `slot` on `stream` (what each slot's graph captures)."""
        d = self.decoder
        ops, w, tc, cc = d.ops, d.w, d.tc, d.cc
        row = d.slot[slot : slot + 1]  # the slot table's entry: the batched kernels' one row is this slot
        codes, x, hn = d.cur[slot : slot + 1], d.x[slot], d.hn[slot]
        ops.gemv(w.codec_head, hn, self.logits[0], stream=stream)
        # Code 0; its draw writes CodePredictor position 1's input row beside position 0.
        ops.batched_sample(
            self.logits,
            codes,
            params=d.params_code0,
            seen=d.seen,
            suppress=(tc.vocab_size - 1024, tc.vocab_size),
            stream_id=0,
            out_stride=NUM_GROUPS,
            row_table=w.cp_inputs[0],
            row_out=self.cx2[1:2],
            row_stride=cc.hidden_size,
            slot=row,
            seed=d.seed,
            step=d.step_index,
            stream=stream,
        )
        if w.proj_w is None:
            self.cx2[0].copy_(hn)
        else:
            ops.gemv(w.proj_w, hn, self.cx2[0], bias=w.proj_b, stream=stream)
        cp = self.code_predictor
        launch_first_two_positions(ops, w.code_predictor, cp, self.cx2, stream)
        for j in range(1, NUM_GROUPS):
            if j == 2 and self.cp_persistent:
                launch_cp_passes(
                    ops,
                    w,
                    cp,
                    x=self.cx2[0],
                    logits=self.cp_logits[0],
                    codes=codes[0],
                    sync=self.cp_sync,
                    stream=stream,
                    slot=row,
                    params=d.params_sub,
                    seed=d.seed,
                    step=d.step_index,
                )
                break
            if j > 1:
                launch_layers(ops, w.code_predictor, cp, self.cx2[0], stream, pos_add=j)
            out = self.cx2[1] if j == 1 else self.cx2[0]
            ops.gemv(w.lm_heads[j - 1], out, self.cp_logits[0], norm_w=w.cp_norm, eps=cc.rms_norm_eps, stream=stream)
            # The draw writes the next position's input row, except after the last code.
            row_table, row_out, row_stride = (
                (w.cp_inputs[j], self.cx2[0:1], cc.hidden_size) if j + 1 < NUM_GROUPS else (None, None, 0)
            )
            ops.batched_sample(
                self.cp_logits,
                codes[:, j:],
                params=d.params_sub,
                stream_id=j,
                out_stride=NUM_GROUPS,
                row_table=row_table,
                row_out=row_out,
                row_stride=row_stride,
                slot=row,
                seed=d.seed,
                step=d.step_index,
                stream=stream,
            )
        ops.batched_store_codes(codes, d.history, slot=row, step=d.step_index, stream=stream)
        ops.batched_embed_sum(
            w.embeddings,
            w.embedding_ptrs,
            codes,
            d.x[slot : slot + 1],
            slot=row,
            trailing=d.trailing,
            n_trailing=d.n_trailing,
            pad=d.pad,
            step=d.step_index,
            stream=stream,
        )
        launch_layers(ops, w.talker, self.talker[slot], x, stream, pos=d.pos[slot : slot + 1])
        ops.rmsnorm(x, w.final_norm, hn, eps=tc.rms_norm_eps, stream=stream)
        ops.batched_advance(row, pos=d.pos, step=d.step_index, stream=stream)

    def step(self, slot: int) -> None:
        """One frame of the stream in `slot`: its graph's replay, else launched now."""
        graph = self.graphs.get(slot)
        if graph is not None:
            graph.replay()
        else:
            device = self.decoder.model.device
            self.launch(slot, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)

    def capture_all(self, pool: torch.cuda._POOL_HANDLE | None) -> torch.cuda._POOL_HANDLE | None:
        """Capture every slot's frame while no slot is busy (each row pads: the draws, the store and the advance
        leave the slot's state alone; the GEMVs and attention write only scratch and positions no stream
        reads). Returns the memory pool, shared with the decoder's other graphs."""
        device = self.decoder.model.device
        side = torch.cuda.Stream(device=device)  # one eager frame first: it loads every kernel before a capture
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self.launch(0, side.cuda_stream)
        torch.cuda.current_stream(device).wait_stream(side)
        for slot in range(self.decoder.slots):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.launch(slot, torch.cuda.current_stream(device).cuda_stream)
            pool = graph.pool()
            self.graphs[slot] = graph
        return pool
