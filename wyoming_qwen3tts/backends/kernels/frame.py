"""One frame of the decode loop (batch 1) as a fixed list of kernel launches over device state.

codec_head -> code-0 processors and draw -> 15 CodePredictor passes (positions 0 = h and 1 = Ec(c0)
together through two-vector GEMVs, then one per code), each ending in a fused final-norm + lm_head
and a draw that also writes the next position's input row -> the 16-embedding sum plus trailing
text -> 28 Talker layers (q/k norm, RoPE, KV append and split attention in one launch, whose last
block per head merges the chunks) -> final norm. Everything that changes between frames (Talker
position, frame index, sampled codes, the repetition-penalty set) lives in device memory, so one
captured graph of these launches replays for every frame.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...model.config import Qwen3TTSConfig, TransformerConfig
from ...model.layers import rope_tables
from ...model.prompt import Prompt
from ...model.talker import KVCache
from ...request import SamplingParams
from .ops import ADD, SWIGLU, Ops
from .weights import ModelWeights, StackWeights

NUM_GROUPS = 16
MIN_NEW_TOKENS = 2  # EOS is masked for the first two code-0 draws (the reference's generate)
NO_EOS = 1 << 30  # min-new-tokens past any length: SamplingParams.suppress_eos
# The one-launch short attention's limits (kShortMaxSeq, kShortMaxElems in kernels/src/attention_short.cuh).
SHORT_MAX_SEQ = 64
SHORT_MAX_ELEMS = 4096

# hook(j, logits): called after the draw of code j with its raw logits (teacher forcing, tests).
Hook = Callable[[int, Tensor], None]


def fits_short_attention(cfg: TransformerConfig, max_seq: int) -> bool:
    hd = cfg.head_dim
    return max_seq <= SHORT_MAX_SEQ and max_seq * hd <= SHORT_MAX_ELEMS and hd <= 256 and hd % 2 == 0


class StackBuffers:
    """KV cache, RoPE tables and work buffers of one stack; rows 0 and 1 of the work buffers hold the
    CodePredictor's first two positions, which run together (row 0 alone serves one position)."""

    def __init__(self, cfg: TransformerConfig, cache: Tensor, splits: int, short: bool) -> None:
        """cache: [layers, 2, max_seq, kv_heads, head_dim] (a KVCache's data, or one slot's block of a batched cache)."""
        hq, hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.cache = cache
        self.splits = splits
        self.short = short  # the one-launch short attention (the CodePredictor), else the split one
        cos, sin = rope_tables(torch.arange(cache.shape[2], device=cache.device), hd, cfg.rope_theta, torch.float32)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        self.scale = hd**-0.5
        self.qkv2 = torch.zeros(2, (hq + 2 * hkv) * hd, dtype=torch.float32, device=cache.device)
        self.attn2 = torch.zeros(2, hq * hd, dtype=torch.float32, device=cache.device)
        self.mlp2 = torch.zeros(2, cfg.intermediate_size, dtype=torch.float32, device=cache.device)
        self.qkv, self.attn, self.mlp = self.qkv2[0], self.attn2[0], self.mlp2[0]
        # The split attention's partials, then one int32 counter per head (zero; the last-block merge).
        self.scratch = (
            torch.zeros(hq * splits * (hd + 2) + hq, dtype=torch.float32, device=cache.device) if splits > 1 else None
        )

    def on(self, cache: Tensor) -> StackBuffers:
        """These buffers over another cache of the same shape (a batched decoder's slots share one set)."""
        if cache.shape != self.cache.shape:
            raise ValueError(f"a cache of {tuple(cache.shape)}, not {tuple(self.cache.shape)}")
        other = copy.copy(self)
        other.cache = cache
        return other


class FrameState:
    """Everything a frame reads and writes on the device; what grows with the Talker context is sized
    for `capacity` positions (grow() replaces it, so graphs that captured it must be captured again)."""

    def __init__(
        self, cfg: Qwen3TTSConfig, dtype: torch.dtype, device: torch.device, capacity: int, attn_splits: int
    ) -> None:
        tc, cc = cfg.talker, cfg.code_predictor
        self.cfg, self.dtype, self.device, self.attn_splits = cfg, dtype, device, attn_splits
        self.state = torch.zeros(2, dtype=torch.int32, device=device)  # [Talker position of the next input, frame]
        self.position, self.frame = self.state[0:1], self.state[1:2]
        self.seed = torch.zeros(1, dtype=torch.int64, device=device)
        self.codes = torch.zeros(NUM_GROUPS, dtype=torch.int32, device=device)  # the frame being built
        self.seen = torch.zeros(tc.vocab_size, dtype=torch.uint8, device=device)  # code 0s so far (penalty)
        self.x = torch.zeros(tc.hidden_size, dtype=torch.float32, device=device)  # Talker residual stream
        self.hn = torch.zeros(
            tc.hidden_size, dtype=torch.float32, device=device
        )  # its final-normed hidden state: the next code 0's input
        self.cx2 = torch.zeros(
            2, cc.hidden_size, dtype=torch.float32, device=device
        )  # CodePredictor streams of positions 0 and 1
        self.cx = self.cx2[0]
        self.logits = torch.zeros(tc.vocab_size, dtype=torch.float32, device=device)
        self.cp_logits = torch.zeros(cc.vocab_size, dtype=torch.float32, device=device)
        self.cp_sync = torch.zeros(2, dtype=torch.int32, device=device)  # q3t_cp_passes' barrier counters
        self.pad = torch.zeros(tc.hidden_size, dtype=torch.float32, device=device)
        self.code_predictor = StackBuffers(cc, KVCache(cc, NUM_GROUPS, dtype, device).data, 1, short=True)
        self.grow(capacity)

    def grow(self, capacity: int) -> None:
        tc = self.cfg.talker
        self.capacity = capacity
        self.cache = KVCache(tc, capacity, self.dtype, self.device)
        self.talker = StackBuffers(tc, self.cache.data, self.attn_splits, short=False)
        self.history = torch.zeros(capacity, NUM_GROUPS, dtype=torch.int32, device=self.device)  # every frame's codes
        # Trailing text rows, padded with PAD to `capacity` rows so the graph needs no per-prompt length.
        self.trailing = torch.zeros(capacity, tc.hidden_size, dtype=torch.float32, device=self.device)

    def load_prompt(self, prompt: Prompt) -> None:
        """Counters, trailing text and the penalty set for a new prompt (its prefill fills the cache and hn)."""
        m = min(prompt.trailing.shape[0], self.capacity)
        self.trailing[:m].copy_(prompt.trailing[:m].float())
        self.trailing[m:].copy_(prompt.pad.float().expand(self.capacity - m, -1))
        self.pad.copy_(prompt.pad.float())
        self.state.copy_(torch.tensor([prompt.length, 0], dtype=torch.int32))
        self.seen.zero_()
        self.codes.zero_()

    def mutable(self) -> tuple[Tensor, ...]:
        """What a frame advances (an eager warm-up frame before a capture saves and restores these)."""
        return self.state, self.seen, self.codes, self.hn, self.x


def launch_layers(
    ops: Ops, w: StackWeights, b: StackBuffers, x: Tensor, stream: int, *, pos: Tensor | None = None, pos_add: int = 0
) -> None:
    """Every layer of a stack for the one vector x, at position (*pos if pos else 0) + pos_add."""
    eps = w.cfg.rms_norm_eps
    for i, L in enumerate(w.layers):
        kc, vc = b.cache[i, 0], b.cache[i, 1]
        ops.gemv(L.qkv, x, b.qkv, norm_w=L.in_norm, eps=eps, stream=stream)
        if b.short:
            ops.rope_attention(
                b.qkv,
                L.q_norm,
                L.k_norm,
                b.cos,
                b.sin,
                kc,
                vc,
                b.attn,
                eps=eps,
                scale=b.scale,
                pos=pos,
                pos_add=pos_add,
                stream=stream,
            )
        else:
            ops.rope_attention_split(
                b.qkv,
                L.q_norm,
                L.k_norm,
                b.cos,
                b.sin,
                kc,
                vc,
                b.attn,
                splits=b.splits,
                scratch=b.scratch,
                eps=eps,
                scale=b.scale,
                pos=pos,
                pos_add=pos_add,
                stream=stream,
            )
        ops.gemv(L.o, b.attn, x, mode=ADD, stream=stream)
        ops.gemv(L.gate_up, x, b.mlp, mode=SWIGLU, norm_w=L.post_norm, eps=eps, stream=stream)
        ops.gemv(L.down, b.mlp, x, mode=ADD, stream=stream)


def launch_first_two_positions(ops: Ops, w: StackWeights, b: StackBuffers, x2: Tensor, stream: int) -> None:
    """Positions 0 and 1 of the empty short cache through every layer together: x2 [2, H]."""
    eps = w.cfg.rms_norm_eps
    for i, L in enumerate(w.layers):
        kc, vc = b.cache[i, 0], b.cache[i, 1]
        ops.gemv_batch(L.qkv, x2, b.qkv2, norm_w=L.in_norm, eps=eps, stream=stream)
        ops.rope_attention_first(
            b.qkv2, L.q_norm, L.k_norm, b.cos, b.sin, kc, vc, b.attn2, eps=eps, scale=b.scale, stream=stream
        )
        ops.gemv_batch(L.o, b.attn2, x2, mode=ADD, stream=stream)
        ops.gemv_batch(L.gate_up, x2, b.mlp2, mode=SWIGLU, norm_w=L.post_norm, eps=eps, stream=stream)
        ops.gemv_batch(L.down, b.mlp2, x2, mode=ADD, stream=stream)


def _input_row(s: FrameState, j: int) -> Tensor:
    """Where CodePredictor position j's input row goes: beside position 0 for j = 1, else the stream."""
    return s.cx2[1] if j == 1 else s.cx


def _drawn_row(w: ModelWeights, s: FrameState, j: int, hook: Hook | None) -> tuple[Tensor | None, Tensor | None]:
    """(row_table, row_out): the draw of code j - 1 also writes position j's input row, except under teacher
    forcing (the hook replaces the drawn code after the draw; q3t_embed_row writes the row then)."""
    if hook is not None or j >= NUM_GROUPS:
        return None, None
    return w.cp_inputs[j - 1], _input_row(s, j)


def launch_cp_passes(
    ops: Ops,
    w: ModelWeights,
    b: StackBuffers,
    *,
    x: Tensor,
    logits: Tensor,
    codes: Tensor,
    sync: Tensor,
    stream: int,
    first: int = 2,
    **draw: Any,
) -> None:
    """CodePredictor positions first..15 in one persistent launch (q3t_cp_passes) over the buffers b: x holds
    position first's input row (the previous draw wrote it), b's cache rows 0..first-1. draw: the draw's
    settings as Ops.cp_passes takes them (do_sample, temperature, top_k, top_p, seed, step; slot, params)."""
    layers = [
        (L.in_norm, L.qkv.data, L.q_norm, L.k_norm, L.o.data, L.post_norm, L.gate_up.data, L.down.data, *b.cache[i])
        for i, L in enumerate(w.code_predictor.layers)
    ]
    draw = {"do_sample": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": None, "step": None} | draw
    ops.cp_passes(
        layers,
        [h.data for h in w.lm_heads],
        list(w.cp_inputs),
        first=first,
        last=NUM_GROUPS - 1,
        eps=w.code_predictor.cfg.rms_norm_eps,
        scale=b.scale,
        final_norm=w.cp_norm,
        cos=b.cos,
        sin=b.sin,
        x=x,
        qkv=b.qkv,
        attn=b.attn,
        mlp=b.mlp,
        logits=logits,
        codes=codes,
        sync=sync,
        stream=stream,
        **draw,
    )


def _code_predictor(
    ops: Ops, w: ModelWeights, s: FrameState, sp: SamplingParams, stream: int, hook: Hook | None, persistent: bool
) -> None:
    """Codes 1..15 of the frame into s.codes: position 0 is hn, position j the row of code j - 1. With
    `persistent` (and no hook), positions 2..15 run as one launch (launch_cp_passes)."""
    cc = w.code_predictor.cfg
    for j in range(1, NUM_GROUPS):
        if persistent and hook is None and j == 2:
            launch_cp_passes(
                ops,
                w,
                s.code_predictor,
                x=s.cx,
                logits=s.cp_logits,
                codes=s.codes,
                sync=s.cp_sync,
                stream=stream,
                do_sample=sp.subtalker_do_sample,
                temperature=sp.subtalker_temperature,
                top_k=sp.subtalker_top_k,
                top_p=sp.subtalker_top_p,
                seed=s.seed,
                step=s.frame,
            )
            return
        if hook is not None:
            ops.embed_row(w.cp_inputs[j - 1], s.codes[j - 1 : j], _input_row(s, j), stream=stream)
        if j == 1:  # position 1's row is in place (written by the code-0 draw): project hn beside it
            if w.proj_w is None:
                s.cx.copy_(s.hn)
            else:
                ops.gemv(w.proj_w, s.hn, s.cx, bias=w.proj_b, stream=stream)
            launch_first_two_positions(ops, w.code_predictor, s.code_predictor, s.cx2, stream)
            x = s.cx2[1]
        else:
            launch_layers(ops, w.code_predictor, s.code_predictor, s.cx, stream, pos_add=j)
            x = s.cx
        ops.gemv(w.lm_heads[j - 1], x, s.cp_logits, norm_w=w.cp_norm, eps=cc.rms_norm_eps, stream=stream)
        row_table, row_out = _drawn_row(w, s, j + 1, hook)
        ops.sample(
            s.cp_logits,
            s.codes[j : j + 1],
            do_sample=sp.subtalker_do_sample,
            temperature=sp.subtalker_temperature,
            top_k=sp.subtalker_top_k,
            top_p=sp.subtalker_top_p,
            seed=s.seed,
            stream_id=j,
            step=s.frame,
            row_table=row_table,
            row_out=row_out,
            stream=stream,
        )
        if hook is not None:
            hook(j, s.cp_logits)


def launch_frame(
    ops: Ops,
    w: ModelWeights,
    s: FrameState,
    sp: SamplingParams,
    stream: int,
    hook: Hook | None = None,
    *,
    cp_persistent: bool = False,
) -> None:
    """Launch one frame on `stream`. `hook` (teacher forcing; never inside a graph) runs after each draw.
    cp_persistent: CodePredictor positions 2..15 in one persistent launch (bf16 / float32 weights, CUDA sm_90+)."""
    tc = s.cfg.talker  # the TalkerConfig (w.talker.cfg is typed as the shared TransformerConfig)
    row_table, row_out = _drawn_row(w, s, 1, hook)
    ops.gemv(w.codec_head, s.hn, s.logits, stream=stream)
    ops.sample(
        s.logits,
        s.codes[0:1],
        seen=s.seen,
        penalty=sp.repetition_penalty,
        eos=tc.codec_eos_token_id,
        min_new_tokens=NO_EOS if sp.suppress_eos else MIN_NEW_TOKENS,
        suppress=(tc.vocab_size - 1024, tc.vocab_size),
        do_sample=sp.do_sample,
        temperature=sp.temperature,
        top_k=sp.top_k,
        top_p=sp.top_p,
        seed=s.seed,
        stream_id=0,
        step=s.frame,
        row_table=row_table,
        row_out=row_out,
        stream=stream,
    )
    if hook is not None:
        hook(0, s.logits)
    _code_predictor(ops, w, s, sp, stream, hook, cp_persistent)
    ops.store_row(s.codes, s.history, s.frame, stream=stream)
    # The next Talker input: 16 embeddings + trailing text (PAD past its end), then the Talker step.
    ops.embed_sum(w.embeddings, w.embedding_ptrs, s.codes, s.trailing, s.pad, s.frame, s.x, stream=stream)
    launch_layers(ops, w.talker, s.talker, s.x, stream, pos=s.position)
    ops.rmsnorm(s.x, w.final_norm, s.hn, eps=tc.rms_norm_eps, stream=stream)
    ops.add_i32(s.state, 1, stream=stream)
