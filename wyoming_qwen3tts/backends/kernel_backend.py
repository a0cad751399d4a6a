"""The frame decode loop on our fused kernels (kernels/, through native.py), replayed as a graph.

Same contract as the torch backend: `start(prompt, sampling, seed, max_frames)` prefills and
returns a session whose `next_frames(n)` gives up to n frames [k, 16] (k < n: end of speech).

How a frame runs (batch 1): one fixed sequence of kernel launches is captured once per backend
(and per sampling settings) into a CUDA/HIP graph: codec_head -> code-0 processors and draw ->
15 CodePredictor passes (positions 0 = h and 1 = Ec(c0) together, through two-vector GEMVs, then
one per code), each ending in a fused final-norm + lm_head and a draw that also writes the next
position's input row (on the 1.7B from input tables projected once at load) -> the
16-embedding sum plus trailing text -> 28 Talker layers (their q/k norm, RoPE, KV append and
split attention in one launch, whose last block per head merges the chunks) -> final norm.
Everything that changes between frames (Talker position, frame index, sampled codes, the
repetition-penalty set) lives in device memory, so the same graph replays for every frame;
`next_frames(n)` replays it n times and syncs once to read the n frames back.

The prompt prefill is a one-off and runs through the torch Talker into the same KV cache
tensor the kernels then read ([layers, 2, max_seq, kv_heads, head_dim], model dtype).
By default that torch prefill is captured as one CUDA graph per bucket length and replayed,
instead of ~1,700 small launches issued from Python (see `_graph_prefill`; `warm_up` captures the
buckets of common prompt lengths at start-up; Q3T_GRAPH_PREFILL=0 runs it eagerly).
The CodePredictor part of the frame (16 positions x 5 layers and 15 draws) runs as ~405 launches
in the graph; Q3T_CP=fused runs it instead as one persistent kernel (`q3t_code_predictor`: one
block per SM, grid-wide barriers between its phases; same numbers up to the order of some float32
sums, same draws). It measured slower on the H200 so far (docs/performance.md), so it is opt-in.
Weights are packed once: q/k/v concatenated, gate/up interleaved row by row (so one GEMV
produces SwiGLU directly), small vectors in float32; activations are float32 throughout.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .. import native
from ..model.config import TransformerConfig
from ..model.prompt import Prompt
from ..model.layers import rope_tables
from ..model.talker import KVCache, Qwen3TTSModel
from ..request import SamplingParams

_LOGGER = logging.getLogger(__name__)

NUM_GROUPS = 16
SHORT_MAX_SEQ = 64  # q3t_rope_attention's largest cache (kShortMaxSeq in kernels/src/attention_short.cuh)
SHORT_MAX_ELEMS = 4096  # and its largest max_seq * head_dim (kShortMaxElems)
MIN_NEW_TOKENS = 2  # EOS is masked for the first two code-0 draws (reference generate)
_NO_ROW = (0, None, 0, 0, None)  # q3t_sample without the embedding-row output
NO_EOS = 1 << 30  # min-new-tokens past any length: SamplingParams.suppress_eos (benchmarks)

# Captured prefill (default; Q3T_GRAPH_PREFILL=0 turns it off): prompt lengths are rounded up to one of these, one graph each, captured
# the first time a bucket is seen. Longer prompts (or buckets past the cache) run eagerly.
GRAPH_PREFILL_ENV = "Q3T_GRAPH_PREFILL"
ATTN_SPLITS_ENV = "Q3T_ATTN_SPLITS"
CP_ENV = "Q3T_CP"  # "layers" (default): one launch per op; "fused": the persistent CodePredictor kernel
# "1" (default): the CodePredictor's positions 0 and 1 go through its layers together (q3t_gemv_batch,
# q3t_rope_attention_first), one pass of launches fewer per frame; "0": one position at a time.
CP_FIRST2_ENV = "Q3T_CP_FIRST2"
# "1" (default): on the 1.7B, the CodePredictor's input tables are kept projected
# (small_to_mtp_projection applied once at load, float32), so a drawn code's row goes straight into
# the CodePredictor stream instead of through a projection GEMV per position; "0": project per position.
CP_PROJECTED_ENV = "Q3T_CP_PROJECTED"
PREFILL_BUCKETS = tuple(range(16, 129, 16)) + tuple(range(160, 513, 32))  # 8 + 12 = 20 at most


# Buckets captured at start-up (KernelBackend.warm_up): prompts of up to this many positions (a
# one-sentence request is ~30, a 600-character paragraph ~160) never wait for a capture.
WARM_PREFILL_POSITIONS = 256


def prefill_bucket(length: int, capacity: int) -> int | None:
    """The bucket a prompt of `length` positions is padded to, or None: run it eagerly."""
    for bucket in PREFILL_BUCKETS:
        if bucket >= length:
            return bucket if bucket <= capacity else None
    return None


@dataclass
class _Layer:
    qkv: Tensor
    o: Tensor
    gate_up: Tensor  # rows interleaved: gate_0, up_0, gate_1, up_1, ...
    down: Tensor
    in_norm: Tensor
    post_norm: Tensor
    q_norm: Tensor
    k_norm: Tensor


def _share_packed(blk: torch.nn.Module, packed: _Layer, cfg: TransformerConfig) -> None:
    """Point a block's q/k/v and gate/up Linear weights at slices of the packed copies."""
    a, m = blk.self_attn, blk.mlp
    nq = cfg.num_attention_heads * cfg.head_dim
    nkv = cfg.num_key_value_heads * cfg.head_dim
    views = {
        a.q_proj: packed.qkv[:nq],
        a.k_proj: packed.qkv[nq : nq + nkv],
        a.v_proj: packed.qkv[nq + nkv :],
        m.gate_proj: packed.gate_up.view(cfg.intermediate_size, 2, cfg.hidden_size)[:, 0],
        m.up_proj: packed.gate_up.view(cfg.intermediate_size, 2, cfg.hidden_size)[:, 1],
    }
    for linear, view in views.items():
        if not torch.equal(linear.weight, view):  # packing is a pure re-layout: anything else is a bug
            raise RuntimeError("packed weights differ from the module's")
        linear.weight = torch.nn.Parameter(view, requires_grad=False)


class _Stack:
    """Packed weights and work buffers of one transformer stack (Talker or CodePredictor)."""

    def __init__(self, cfg: TransformerConfig, layers: torch.nn.ModuleList, cache: Tensor, max_seq: int,
                 splits: int, device: torch.device) -> None:  # fmt: skip
        self.cfg = cfg
        self.cache = cache  # [layers, 2, max_seq, kv, hd]
        self.max_seq = max_seq
        self.splits = splits
        f32 = dict(dtype=torch.float32, device=device)
        self.layers: list[_Layer] = []
        with torch.no_grad():
            for blk in layers:
                a, m = blk.self_attn, blk.mlp
                packed = _Layer(
                    qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0).contiguous(),
                    o=a.o_proj.weight.contiguous(),
                    gate_up=torch.stack([m.gate_proj.weight, m.up_proj.weight], 1)
                    .reshape(2 * cfg.intermediate_size, cfg.hidden_size)
                    .contiguous(),
                    down=m.down_proj.weight.contiguous(),
                    in_norm=blk.input_layernorm.weight.to(**f32).contiguous(),
                    post_norm=blk.post_attention_layernorm.weight.to(**f32).contiguous(),
                    q_norm=a.q_norm.weight.to(**f32).contiguous(),
                    k_norm=a.k_norm.weight.to(**f32).contiguous(),
                )
                # The torch modules (still used for the prompt prefill) now read the packed
                # tensors through views, so each weight lives on the GPU once; doing it layer by
                # layer frees the originals as we go and keeps the load-time peak low.
                _share_packed(blk, packed, cfg)
                self.layers.append(packed)
        hq, hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        cos, sin = rope_tables(torch.arange(max_seq, device=device), hd, cfg.rope_theta, torch.float32)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        # Work buffers of two positions (the CodePredictor's first two run together); row 0 serves one.
        self.qkv2 = torch.zeros(2, (hq + 2 * hkv) * hd, **f32)
        self.attn2 = torch.zeros(2, hq * hd, **f32)
        self.mlp2 = torch.zeros(2, cfg.intermediate_size, **f32)
        self.qkv, self.attn, self.mlp = self.qkv2[0], self.attn2[0], self.mlp2[0]
        # Split attention partials, then one int32 counter per head (zero; q3t_rope_attention_split's merge).
        self.scratch = torch.zeros(hq * splits * (hd + 2) + hq, **f32)
        self.scale = hd**-0.5
        # Short caches (the CodePredictor) take the one-launch q3t_rope_attention.
        self.short = (splits == 1 and max_seq <= SHORT_MAX_SEQ and max_seq * hd <= SHORT_MAX_ELEMS and hd <= 256
                      and hd % 2 == 0)  # fmt: skip


class KernelDecodeSession:
    def __init__(self, backend: "KernelBackend", prompt: Prompt, sampling: SamplingParams, seed: int,
                 max_frames: int) -> None:  # fmt: skip
        self.b = backend
        self.max_frames = max_frames
        self.frames_done = 0
        self.finished = False
        self.graph = backend._prepare(prompt, sampling, seed, max_frames)
        # Pinned host copy of the codes so the device-to-host copies are asynchronous.
        self._host = torch.empty(max_frames, NUM_GROUPS, dtype=torch.int32, pin_memory=True)
        self._pending: list[tuple[int, int, torch.cuda.Event]] = []

    def launch(self, n: int) -> int:
        """Enqueue up to n frames (graph replays) and an async copy of their codes; no sync.

        The engine launches group k+1 before it decodes group k's audio on another stream, so
        the codec overlaps the decode loop. Returns how many frames were enqueued.
        """
        b = self.b
        if b._owner is not self:
            raise RuntimeError("another session started on this backend; a KernelBackend runs one session at a time")
        start = self.frames_done + sum(k for _, k, _ in self._pending)
        k = 0 if self.finished else min(n, self.max_frames - start)
        if k <= 0:
            return 0
        for _ in range(k):
            self.graph.replay()
        self._host[start : start + k].copy_(b.history[start : start + k], non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._pending.append((start, k, done))
        return k

    def collect(self) -> np.ndarray:
        """Codes of the oldest launched group, cut at end of speech (waits for that group only)."""
        if not self._pending:
            return np.zeros((0, NUM_GROUPS), dtype=np.int64)
        start, k, done = self._pending.pop(0)
        done.synchronize()  # the one host sync of this frame group
        if self.finished:  # end of speech came in an earlier group: this one is discarded
            return np.zeros((0, NUM_GROUPS), dtype=np.int64)
        codes = self._host[start : start + k].numpy().astype(np.int64)
        eos = np.nonzero(codes[:, 0] == self.b.eos_id)[0]
        if eos.size:
            codes = codes[: eos[0]]
            self.finished = True
        self.frames_done += codes.shape[0]
        if self.frames_done >= self.max_frames:
            self.finished = True
        return codes

    def next_frames(self, n: int) -> np.ndarray:
        if self.finished or n <= 0:
            return np.zeros((0, NUM_GROUPS), dtype=np.int64)
        while self._pending:  # groups launched ahead come first
            codes = self.collect()
            if len(codes) or self.finished:
                return codes
        self.launch(n)
        return self.collect()


class KernelBackend:
    """Decode loop on the q3t kernels. Raises native.NativeUnavailable where they cannot run."""

    name = "kernels"
    # One decode session at a time: the captured frame graph works on the backend's own buffers.
    concurrent_sessions = False

    def __init__(self, model: Qwen3TTSModel, *, capacity: int = 2048, attn_splits: int | None = None,
                 pdl: bool | None = None, cp_fused: bool | None = None) -> None:  # fmt: skip
        if model.device.type != "cuda":
            raise native.NativeUnavailable("the kernel backend needs the model on a CUDA/ROCm device")
        if model.dtype not in (torch.float32, torch.bfloat16):
            raise native.NativeUnavailable(f"the kernels take float32 or bfloat16 weights, not {model.dtype}")
        self.lib = native.load(model.device.index or 0)
        # Programmatic dependent launch (CUDA sm_90+): overlaps each kernel's launch and weight
        # prefetch with the kernel before it (~10% per frame on the H200). On by default where
        # supported (Q3T_PDL=0 turns it off); falls back silently on HIP and older GPUs.
        self.pdl = os.environ.get("Q3T_PDL", "1") != "0" if pdl is None else pdl
        self._init_graph_prefill()
        self.model = model
        self.device = model.device
        self.wdtype = native.F32 if model.dtype == torch.float32 else native.BF16
        tc, cc = model.cfg.talker, model.cfg.code_predictor
        self.tc, self.cc = tc, cc
        self.eos_id = tc.codec_eos_token_id
        if attn_splits is None:  # most chunks of the Talker context per head (Q3T_ATTN_SPLITS, default 32)
            attn_splits = int(os.environ.get(ATTN_SPLITS_ENV, "32"))
        if not 1 <= attn_splits <= 1024:
            raise ValueError(f"attention splits must be 1..1024, got {attn_splits}")
        self.attn_splits = attn_splits
        talker = model.talker
        cp = talker.code_predictor
        f32 = dict(dtype=torch.float32, device=self.device)
        i32 = dict(dtype=torch.int32, device=self.device)
        with torch.no_grad():
            self.final_norm = talker.model.norm.weight.to(**f32).contiguous()
            self.cp_norm = cp.model.norm.weight.to(**f32).contiguous()
            self.codec_head = talker.codec_head.weight.contiguous()
            self.codec_emb = talker.model.codec_embedding.weight.contiguous()
            self.cp_emb = [e.weight.contiguous() for e in cp.model.codec_embedding]
            self.lm_heads = [h.weight.contiguous() for h in cp.lm_head]
            proj = cp.small_to_mtp_projection
            self.proj_w = proj.weight.contiguous() if isinstance(proj, torch.nn.Linear) else None
            self.proj_b = proj.bias.to(**f32).contiguous() if self.proj_w is not None else None
        # Device array of the 16 tables summed into the next Talker input.
        self.emb_tables = torch.tensor([t.data_ptr() for t in [self.codec_emb, *self.cp_emb]], dtype=torch.int64,
                                       device=self.device)  # fmt: skip
        self.cp_cache = KVCache(cc, NUM_GROUPS, model.dtype, self.device)
        self.cp = _Stack(cc, cp.model.layers, self.cp_cache.data, NUM_GROUPS, 1, self.device)
        if cp_fused is None:
            mode = os.environ.get(CP_ENV, "layers")
            if mode not in ("fused", "layers"):
                raise ValueError(f"{CP_ENV}={mode!r}: expected fused or layers")
            cp_fused = mode == "fused"
        self.cp_fused = cp_fused and self._fused_cp_fits()
        if self.cp_fused:
            self._init_fused_cp()
        self.cp_first2 = self.cp.short and os.environ.get(CP_FIRST2_ENV, "1") != "0"
        # The layered CodePredictor's position-j input is a row of table j - 1 (codec embedding, then
        # its own tables 0..13) through the projection: project the tables once (float32, +130 MB on
        # the 1.7B) instead of one GEMV per position and frame. (The persistent kernel projects itself.)
        self.cp_proj_tables: list[Tensor] | None = None
        if self.proj_w is not None and not self.cp_fused and os.environ.get(CP_PROJECTED_ENV, "1") != "0":
            with torch.no_grad():
                w32 = self.proj_w.float()
                self.cp_proj_tables = [torch.addmm(self.proj_b, t.float(), w32.t()).contiguous()
                                       for t in (self.codec_emb, *self.cp_emb[: NUM_GROUPS - 2])]  # fmt: skip
        # Frame state: [talker position of the next input, frame index].
        self.state = torch.zeros(2, **i32)
        self.seed = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.cur = torch.zeros(NUM_GROUPS, **i32)  # codes of the frame being built
        self.seen = torch.zeros(tc.vocab_size, dtype=torch.uint8, device=self.device)
        self.x = torch.zeros(tc.hidden_size, **f32)  # Talker residual stream
        # CodePredictor residual streams: row 0, and row 1 for position 1 while it runs with position 0.
        self.cx2 = torch.zeros(2, cc.hidden_size, **f32)
        self.cx = self.cx2[0]
        # CodePredictor inputs at the Talker's width: row 0 the final-normed Talker hidden state hn
        # (position 0), row 1 an embedding row (position 1, then each later one when they are
        # projected per position), so on the 1.7B both rows of positions 0 and 1 can go through the
        # projection in one call. (hn as the 0.6B's CodePredictor stream itself, saving its copy,
        # measured no faster in the third session.)
        self.e2 = torch.zeros(2, tc.hidden_size, **f32)
        self.hn, self.e = self.e2[0], self.e2[1]
        self.logits = torch.zeros(tc.vocab_size, **f32)
        self.cp_logits = torch.zeros(cc.vocab_size, **f32)
        self.capacity = 0
        self._graph_key: tuple[object, ...] | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._owner: KernelDecodeSession | None = None
        self._alloc(capacity)

    # ---------------------------------------------------------------- buffers

    def _alloc(self, capacity: int) -> None:
        """(Re)size everything whose length is the Talker context; invalidates the captured graph."""
        tc = self.tc
        f32 = dict(dtype=torch.float32, device=self.device)
        self.capacity = capacity
        self.cache = KVCache(tc, capacity, self.model.dtype, self.device)
        self.talk = _Stack(tc, self.model.talker.model.layers, self.cache.data, capacity, self.attn_splits,
                           self.device)  # fmt: skip
        # Trailing text rows, padded with PAD to `capacity` rows so the graph needs no per-prompt length.
        self.trailing = torch.zeros(capacity, tc.hidden_size, **f32)
        self.pad = torch.zeros(tc.hidden_size, **f32)
        self.history = torch.zeros(capacity, NUM_GROUPS, dtype=torch.int32, device=self.device)
        self._graph = None
        self._graph_key = None

    def _fused_cp_fits(self) -> bool:
        """Whether q3t_code_predictor takes this CodePredictor's shapes (every released size does)."""
        cc, tc = self.cc, self.tc
        v = 8 if self.wdtype == native.BF16 else 4
        return (
            NUM_GROUPS <= 64
            and NUM_GROUPS * cc.head_dim <= SHORT_MAX_ELEMS
            and cc.head_dim <= 256
            and cc.head_dim % 2 == 0
            and cc.vocab_size <= 4096
            and all(n % v == 0 for n in (cc.hidden_size, cc.intermediate_size,
                                         cc.num_attention_heads * cc.head_dim, tc.hidden_size))  # fmt: skip
            and (self.proj_w is not None or tc.hidden_size == cc.hidden_size)
        )

    def _init_fused_cp(self) -> None:
        """Pointer table, work buffers and barrier word of the persistent CodePredictor kernel."""
        cc = self.cc
        tables = [self.codec_emb, *self.cp_emb]
        ptrs = [t.data_ptr() for L in self.cp.layers
                for t in (L.qkv, L.o, L.gate_up, L.down, L.in_norm, L.post_norm, L.q_norm, L.k_norm)]  # fmt: skip
        ptrs += [h.data_ptr() for h in self.lm_heads] + [t.data_ptr() for t in tables[: NUM_GROUPS - 1]]
        if any(p % 16 for p in ptrs):
            raise native.NativeUnavailable("the persistent CodePredictor needs 16-byte aligned weights")
        self.cp_ptrs = torch.tensor(ptrs, dtype=torch.int64, device=self.device)
        self.cp_logits_all = torch.zeros(NUM_GROUPS - 1, cc.vocab_size, dtype=torch.float32, device=self.device)
        self.cp_sync = torch.zeros(2, dtype=torch.int32, device=self.device)
        self.forced = torch.zeros(NUM_GROUPS, dtype=torch.int32, device=self.device)

    def _fused_cp_call(self, s: SamplingParams, stream: int, forced: bool = False) -> None:
        """Codes 1..15 of the frame into self.cur: the persistent kernel."""
        tc, cc, st = self.tc, self.cc, self.cp
        proj = self.proj_w is not None
        self.lib.call(
            "q3t_code_predictor", self.wdtype, self.cp_ptrs.data_ptr(), len(st.layers), NUM_GROUPS - 1,
            cc.hidden_size, cc.intermediate_size, cc.num_attention_heads, cc.num_key_value_heads, cc.head_dim,
            cc.vocab_size, tc.hidden_size, tc.vocab_size, cc.vocab_size, cc.rms_norm_eps, st.scale,
            self.proj_w.data_ptr() if proj else None, self.proj_b.data_ptr() if proj else None,
            self.cp_norm.data_ptr(), st.cos.data_ptr(), st.sin.data_ptr(), st.cache.data_ptr(), self.hn.data_ptr(),
            self.cur.data_ptr(), self.forced.data_ptr() if forced else None,
            native.SAMPLE_DO_SAMPLE if s.subtalker_do_sample else 0, float(s.subtalker_temperature),
            int(s.subtalker_top_k), float(s.subtalker_top_p), self.seed.data_ptr(), self.state.data_ptr() + 4,
            self.cx.data_ptr(), st.qkv.data_ptr(), st.attn.data_ptr(), st.mlp.data_ptr(),
            self.cp_logits_all.data_ptr(), self.cp_sync.data_ptr(), stream,
        )  # fmt: skip

    # ---------------------------------------------------------------- one frame as launches

    def _layer_calls(self, st: _Stack, x: Tensor, pos_ptr: int | None, pos_add: int, stream: int) -> None:
        lib, wd, c = self.lib, self.wdtype, st.cfg
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        eps = c.rms_norm_eps
        xp = x.data_ptr()
        for i, L in enumerate(st.layers):
            kc, vc = st.cache[i, 0], st.cache[i, 1]
            lib.call("q3t_gemv", wd, L.qkv.data_ptr(), L.qkv.shape[0], c.hidden_size, xp, L.in_norm.data_ptr(), eps,
                     None, st.qkv.data_ptr(), native.GEMV_STORE, stream)  # fmt: skip
            if st.short:  # the CodePredictor's 16 positions: norm, RoPE, append and attention in one launch
                lib.call("q3t_rope_attention", wd, st.qkv.data_ptr(), L.q_norm.data_ptr(), L.k_norm.data_ptr(), eps,
                         st.cos.data_ptr(), st.sin.data_ptr(), pos_ptr, pos_add, hq, hkv, hd, st.max_seq, st.scale,
                         kc.data_ptr(), vc.data_ptr(), st.attn.data_ptr(), stream)  # fmt: skip
            else:  # the Talker: norm, RoPE, append and the split attention (merged by its last blocks) in one launch
                lib.call("q3t_rope_attention_split", wd, st.qkv.data_ptr(), L.q_norm.data_ptr(), L.k_norm.data_ptr(),
                         eps, st.cos.data_ptr(), st.sin.data_ptr(), pos_ptr, pos_add, hq, hkv, hd, st.max_seq,
                         st.scale, st.splits, st.scratch.data_ptr(), kc.data_ptr(), vc.data_ptr(), st.attn.data_ptr(),
                         stream)  # fmt: skip
            lib.call("q3t_gemv", wd, L.o.data_ptr(), c.hidden_size, hq * hd, st.attn.data_ptr(), None, eps, None, xp,
                     native.GEMV_ADD, stream)  # fmt: skip
            lib.call("q3t_gemv", wd, L.gate_up.data_ptr(), 2 * c.intermediate_size, c.hidden_size, xp,
                     L.post_norm.data_ptr(), eps, None, st.mlp.data_ptr(), native.GEMV_SWIGLU, stream)  # fmt: skip
            lib.call("q3t_gemv", wd, L.down.data_ptr(), c.hidden_size, c.intermediate_size, st.mlp.data_ptr(), None,
                     eps, None, xp, native.GEMV_ADD, stream)  # fmt: skip

    def _first2_layer_calls(self, st: _Stack, stream: int) -> None:
        """Positions 0 and 1 of the (empty) short cache through every layer together: x = cx2 [2, H]."""
        lib, wd, c = self.lib, self.wdtype, st.cfg
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        eps = c.rms_norm_eps
        xp = self.cx2.data_ptr()
        for i, L in enumerate(st.layers):
            kc, vc = st.cache[i, 0], st.cache[i, 1]
            lib.call("q3t_gemv_batch", wd, L.qkv.data_ptr(), L.qkv.shape[0], c.hidden_size, xp, 2, L.in_norm.data_ptr(),
                     eps, None, st.qkv2.data_ptr(), native.GEMV_STORE, stream)  # fmt: skip
            lib.call("q3t_rope_attention_first", wd, st.qkv2.data_ptr(), L.q_norm.data_ptr(), L.k_norm.data_ptr(), eps,
                     st.cos.data_ptr(), st.sin.data_ptr(), 2, hq, hkv, hd, st.max_seq, st.scale, kc.data_ptr(),
                     vc.data_ptr(), st.attn2.data_ptr(), stream)  # fmt: skip
            lib.call("q3t_gemv_batch", wd, L.o.data_ptr(), c.hidden_size, hq * hd, st.attn2.data_ptr(), 2, None, eps,
                     None, xp, native.GEMV_ADD, stream)  # fmt: skip
            lib.call("q3t_gemv_batch", wd, L.gate_up.data_ptr(), 2 * c.intermediate_size, c.hidden_size, xp, 2,
                     L.post_norm.data_ptr(), eps, None, st.mlp2.data_ptr(), native.GEMV_SWIGLU, stream)  # fmt: skip
            lib.call("q3t_gemv_batch", wd, L.down.data_ptr(), c.hidden_size, c.intermediate_size, st.mlp2.data_ptr(), 2,
                     None, eps, None, xp, native.GEMV_ADD, stream)  # fmt: skip

    def _cp_input(self, src: Tensor, stream: int) -> None:
        """cx = small_to_mtp_projection(src) (Identity on 0.6B)."""
        if self.proj_w is None:
            self.cx.copy_(src)
        else:
            self.lib.call("q3t_gemv", self.wdtype, self.proj_w.data_ptr(), self.cc.hidden_size, self.tc.hidden_size,
                          src.data_ptr(), None, 0.0, self.proj_b.data_ptr(), self.cx.data_ptr(), native.GEMV_STORE,
                          stream)  # fmt: skip

    def _frame_calls(self, s: SamplingParams, stream: int,
                     hook: Callable[[int, Tensor], None] | None = None) -> None:  # fmt: skip
        """Launch one frame. `hook(j, logits)` (tests only, never in a graph) runs after each draw of code j."""
        lib, wd, tc, cc = self.lib, self.wdtype, self.tc, self.cc
        state0 = self.state.data_ptr()
        step_ptr = state0 + 4
        cur = self.cur.data_ptr()
        # Code 0
        lib.call("q3t_gemv", wd, self.codec_head.data_ptr(), tc.vocab_size, tc.hidden_size, self.hn.data_ptr(), None,
                 0.0, None, self.logits.data_ptr(), native.GEMV_STORE, stream)  # fmt: skip
        row = self._cp_row_args(1) if not self.cp_fused and self._draw_embeds(1, hook) else _NO_ROW
        lib.call("q3t_sample", self.logits.data_ptr(), tc.vocab_size, self.seen.data_ptr(),
                 float(s.repetition_penalty), self.eos_id, NO_EOS if s.suppress_eos else MIN_NEW_TOKENS,
                 tc.vocab_size - 1024, tc.vocab_size,
                 native.SAMPLE_DO_SAMPLE if s.do_sample else 0, float(s.temperature), int(s.top_k), float(s.top_p),
                 self.seed.data_ptr(), 0, step_ptr, cur, *row, stream)  # fmt: skip
        if hook:
            hook(0, self.logits)
        if self.cp_fused:
            self._fused_cp_call(s, stream, forced=hook is not None)
            if hook:
                for j in range(1, NUM_GROUPS):
                    hook(j, self.cp_logits_all[j - 1])
        else:
            self._layered_cp_calls(s, stream, hook)
        lib.call("q3t_store_row", cur, NUM_GROUPS, self.history.data_ptr(), step_ptr, self.capacity, stream)
        # Next Talker input: 16 embeddings + trailing text (PAD past its end), then the Talker step.
        lib.call("q3t_embed_sum", wd, self.emb_tables.data_ptr(), NUM_GROUPS, tc.vocab_size, cc.vocab_size,
                 tc.hidden_size, cur, self.trailing.data_ptr(), self.capacity, self.pad.data_ptr(), step_ptr,
                 self.x.data_ptr(), stream)  # fmt: skip
        self._layer_calls(self.talk, self.x, state0, 0, stream)
        lib.call("q3t_rmsnorm", self.x.data_ptr(), self.final_norm.data_ptr(), self.hn.data_ptr(), tc.hidden_size,
                 tc.rms_norm_eps, stream)  # fmt: skip
        lib.call("q3t_add_i32", state0, 2, 1, stream)

    def _draw_embeds(self, j: int, hook: Callable[[int, Tensor], None] | None) -> bool:
        """Whether the draw of code j - 1 also writes CodePredictor position j's input row (else
        q3t_embed_row does, after it). Not under teacher forcing (the hook replaces the drawn code
        after the draw), and not for position 1 on the 0.6B when positions run one at a time: its row
        would go straight into the CodePredictor stream that position 0 is still using."""
        return hook is None and (j >= 2 or self.cp_first2 or self._projects_rows())

    def _projects_rows(self) -> bool:
        """Whether each position's input row goes through a projection GEMV (the 1.7B without
        projected tables): the row is then written beside the CodePredictor stream, not into it."""
        return self.proj_w is not None and self.cp_proj_tables is None

    def _cp_row_args(self, j: int) -> tuple[int, int, int, int, int]:
        """q3t_sample's embedding-row arguments for CodePredictor position j (1..15): the row of code
        j - 1 from its table (codec embedding for j = 1, else CodePredictor table j - 2; on the 1.7B
        that table projected), into the CodePredictor's stream (row 1 for position 1 when positions 0
        and 1 run together), or into the projection's input when rows are projected per position."""
        table, rows = (self.codec_emb, self.tc.vocab_size) if j == 1 else (self.cp_emb[j - 2], self.cc.vocab_size)
        if self._projects_rows():
            return self.wdtype, table.data_ptr(), rows, self.tc.hidden_size, self.e.data_ptr()
        dst = self.cx2[1] if j == 1 and self.cp_first2 else self.cx  # position 1 beside position 0 when together
        if self.cp_proj_tables is not None:
            return native.F32, self.cp_proj_tables[j - 1].data_ptr(), rows, self.cc.hidden_size, dst.data_ptr()
        return self.wdtype, table.data_ptr(), rows, self.tc.hidden_size, dst.data_ptr()

    def _layered_cp_calls(self, s: SamplingParams, stream: int,
                          hook: Callable[[int, Tensor], None] | None) -> None:  # fmt: skip
        """Codes 1..15 of the frame into self.cur, one launch per op (Q3T_CP=layers)."""
        lib, wd, cc = self.lib, self.wdtype, self.cc
        step_ptr = self.state.data_ptr() + 4
        cur = self.cur.data_ptr()
        # CodePredictor: position 0 is h, position 1 is Ec(c0), then one position per code.
        if not self.cp_first2:
            self._cp_input(self.hn, stream)
            self._layer_calls(self.cp, self.cx, None, 0, stream)
        sub_flags = native.SAMPLE_DO_SAMPLE if s.subtalker_do_sample else 0
        for j in range(1, NUM_GROUPS):
            if not self._draw_embeds(j, hook):
                wdt, table, rows, h, dst = self._cp_row_args(j)
                lib.call("q3t_embed_row", wdt, table, rows, h, cur + 4 * (j - 1), dst, stream)
            x = self.cx
            if j == 1 and self.cp_first2:  # positions 0 (h) and 1 (Ec(c0)) together, from rows 0 and 1
                if self._projects_rows():
                    lib.call("q3t_gemv_batch", wd, self.proj_w.data_ptr(), cc.hidden_size, self.tc.hidden_size,
                             self.e2.data_ptr(), 2, None, 0.0, self.proj_b.data_ptr(), self.cx2.data_ptr(),
                             native.GEMV_STORE, stream)  # fmt: skip
                else:  # row 1 is in place already (projected, or the 0.6B's own width)
                    self._cp_input(self.hn, stream)
                self._first2_layer_calls(self.cp, stream)
                x = self.cx2[1]
            else:
                if self._projects_rows():
                    self._cp_input(self.e, stream)
                self._layer_calls(self.cp, self.cx, None, j, stream)
            lib.call("q3t_gemv", wd, self.lm_heads[j - 1].data_ptr(), cc.vocab_size, cc.hidden_size,
                     x.data_ptr(), self.cp_norm.data_ptr(), cc.rms_norm_eps, None, self.cp_logits.data_ptr(),
                     native.GEMV_STORE, stream)  # fmt: skip
            row = self._cp_row_args(j + 1) if j + 1 < NUM_GROUPS and self._draw_embeds(j + 1, hook) else _NO_ROW
            lib.call("q3t_sample", self.cp_logits.data_ptr(), cc.vocab_size, None, 1.0, -1, 0, 0, 0, sub_flags,
                     float(s.subtalker_temperature), int(s.subtalker_top_k), float(s.subtalker_top_p), self.seed.data_ptr(), j,
                     step_ptr, cur + 4 * j, *row, stream)  # fmt: skip
            if hook:
                hook(j, self.cp_logits)

    # ---------------------------------------------------------------- sessions

    def _init_graph_prefill(self) -> None:
        self.graph_prefill = os.environ.get(GRAPH_PREFILL_ENV, "1") != "0"
        self._prefill_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # bucket -> graph
        self._pg_cache: KVCache | None = None  # the cache the graphs write (re-captured after _alloc)
        self._pg_x: Tensor | None = None  # static input [max bucket, H], model dtype
        self._pg_last: Tensor | None = None  # int64 [1]: prompt length - 1, the row gathered into hn
        self._pg_pool: tuple[int, int] | None = None  # one memory pool for all prefill graphs
        self._pg_stream: torch.cuda.Stream | None = None  # their warm-up and capture stream

    def _prefill(self, prompt: Prompt, max_frames: int) -> None:
        need = prompt.length + max_frames + 1
        if need > self.capacity:
            self._alloc(max(need, 2 * self.capacity))
        with torch.inference_mode():
            bucket = prefill_bucket(prompt.length, self.capacity) if self.graph_prefill else None
            if bucket is None or not self._graph_prefill(prompt.embeds, bucket):
                self.cache.reset()
                h = self.model.talker.model(prompt.embeds.to(self.model.dtype), self.cache)[-1]
                self.hn.copy_(h.float())
            m = min(prompt.trailing.shape[0], self.capacity)
            self.trailing[:m].copy_(prompt.trailing[:m].float())
            self.trailing[m:].copy_(prompt.pad.float().expand(self.capacity - m, -1))
            self.pad.copy_(prompt.pad.float())
            self.state.copy_(torch.tensor([prompt.length, 0], dtype=torch.int32))
            self.seen.zero_()
            self.cur.zero_()

    def _graph_prefill(self, embeds: Tensor, bucket: int) -> bool:
        """Talker.model over the prompt right-padded with zero rows to `bucket` positions, as a
        captured graph: the scheme of Transformer.prefill_bucketed, with the last real row gathered
        through a device index so that one graph serves every length in the bucket.

        Returns False, after one warning, when the capture fails (prefills then run eagerly).
        The graph writes cache positions 0..bucket-1 (the pads' K/V past the prompt are
        overwritten by the decode steps before the attention kernel reads them: it reads
        [0, position]) and self.hn, the buffers the decode graph reads. Every prefill graph shares
        one memory pool: they keep no live tensors in it (outputs go to the cache and hn) and
        replay one at a time on one stream, so the pool holds one bucket's activations, not 20.
        """
        n = embeds.shape[0]
        if self._pg_cache is not self.cache:  # first use, or _alloc replaced the cache the graphs write
            self._prefill_graphs.clear()
            self._pg_cache = self.cache
            self._pg_pool = None  # the old graphs' pool goes with them
        if self._pg_x is None:
            self._pg_x = torch.zeros(PREFILL_BUCKETS[-1], self.tc.hidden_size, dtype=self.model.dtype,
                                     device=self.device)  # fmt: skip
            self._pg_last = torch.zeros(1, dtype=torch.int64, device=self.device)
        x = self._pg_x[:bucket]
        x[:n].copy_(embeds)
        x[n:].zero_()
        self._pg_last.fill_(n - 1)
        graph = self._prefill_graphs.get(bucket)
        if graph is None:
            try:
                graph = self._capture_prefill(bucket)
            except torch.cuda.OutOfMemoryError:
                raise  # the server's out-of-memory handling takes it from here
            except RuntimeError as err:
                # A runtime that cannot capture these torch ops (a ROCm or driver version, say): every
                # prefill runs eagerly from now on, as with Q3T_GRAPH_PREFILL=0. Said once, loudly.
                _LOGGER.warning("Captured prefill failed (%s); prefilling eagerly from now on", err)
                self.graph_prefill = False
                self._prefill_graphs.clear()
                return False
            self._prefill_graphs[bucket] = graph
        graph.replay()
        self.cache.length = n
        return True

    def _prefill_run(self, bucket: int) -> Callable[[], None]:
        """What a prefill graph holds: the Talker over the static input's first `bucket` rows from
        position 0, then hn = the final-normed row at the device index (prompt length - 1)."""
        x, last, cache, talker = self._pg_x[:bucket], self._pg_last, self.cache, self.model.talker.model

        def run() -> None:
            cache.reset()
            out = talker(x, cache)  # [bucket, H], final-normed
            self.hn.copy_(out.index_select(0, last)[0])  # copy_ casts to float32 as .float() does

        return run

    def _capture_prefill(self, bucket: int) -> torch.cuda.CUDAGraph:
        run = self._prefill_run(bucket)
        if self._pg_pool is None:
            self._pg_pool = torch.cuda.graph_pool_handle()
        if self._pg_stream is None:
            self._pg_stream = torch.cuda.Stream(device=self.device)
        side = self._pg_stream
        # Warm-up on the side stream (cuBLAS handle and its per-stream workspace, lazily loaded
        # kernels), as the CUDA-graph docs ask: torch.cuda.graph itself only syncs and empties the
        # allocator cache. Capturing on that same stream reuses the workspace made here (outside the
        # graphs' pool); one stream for all buckets makes one workspace, not one per bucket. The
        # warm-up writes the cache and hn with this very prompt; the replay that follows (on the
        # current stream) writes the same.
        current = torch.cuda.current_stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            run()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pg_pool, stream=side):
            run()
        current.wait_stream(side)
        return graph

    def _prepare(self, prompt: Prompt, sampling: SamplingParams, seed: int, max_frames: int) -> torch.cuda.CUDAGraph:
        self._prefill(prompt, max_frames)
        self.seed.fill_(seed if seed < 2**63 else seed - 2**64)  # int64 storage of the 64-bit seed
        key = (sampling, self.capacity, self.pdl)
        if self._graph is None or self._graph_key != key:
            self._graph = self._capture(sampling)
            self._graph_key = key
        return self._graph

    def _set_pdl(self) -> None:
        try:
            self.lib.call("q3t_set_pdl", int(self.pdl))
        except native.NativeError:
            self.pdl = False
            self.lib.call("q3t_set_pdl", 0)

    def _capture(self, s: SamplingParams) -> torch.cuda.CUDAGraph:
        self._set_pdl()
        # Save the state a warm-up frame would disturb, run one frame eagerly (loads every
        # kernel before capture), restore, then capture.
        saved = [t.clone() for t in (self.state, self.seen, self.cur, self.hn, self.x)]
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._frame_calls(s, side.cuda_stream)
        torch.cuda.current_stream(self.device).wait_stream(side)
        for t, v in zip((self.state, self.seen, self.cur, self.hn, self.x), saved):
            t.copy_(v)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self._frame_calls(s, torch.cuda.current_stream(self.device).cuda_stream)
        # Restore once more: capture does not execute, but be explicit that state is the prefill's.
        for t, v in zip((self.state, self.seen, self.cur, self.hn, self.x), saved):
            t.copy_(v)
        return g

    def warm_up(self, max_positions: int = WARM_PREFILL_POSITIONS) -> int:
        """Capture the prefill graphs of every bucket up to `max_positions` now (a capture costs
        tens of milliseconds, paid here instead of by the first request of each length). Writes the
        cache and hn, so no session may be open. Returns how many graphs were captured."""
        if not self.graph_prefill:
            return 0
        self._owner = None  # any earlier session is over: it must not replay on what this writes
        before = len(self._prefill_graphs)
        with torch.inference_mode():
            for bucket in PREFILL_BUCKETS:
                if bucket > min(max_positions, self.capacity):
                    break
                if self._pg_cache is not self.cache or bucket not in self._prefill_graphs:
                    if not self._graph_prefill(torch.zeros(bucket, self.tc.hidden_size, dtype=self.model.dtype,
                                                           device=self.device), bucket):  # fmt: skip
                        return 0  # capture does not work here: prefills run eagerly (logged)
        return len(self._prefill_graphs) - before

    def start(self, prompt: Prompt, sampling: SamplingParams, seed: int, max_frames: int) -> KernelDecodeSession:
        session = KernelDecodeSession(self, prompt, sampling, seed & 0xFFFF_FFFF_FFFF_FFFF, max_frames)
        self._owner = session
        return session

    # ---------------------------------------------------------------- tests: eager, teacher-forced

    def teacher_forced(self, prompt: Prompt, codes: np.ndarray,
                       after_prefill: Callable[[], None] | None = None) -> list[list[Tensor]]:  # fmt: skip
        """Run frames eagerly with the given codes forced in; returns per frame the 16 logits
        vectors (float32, before the processors): codec_head, then lm_head[0..14].
        `after_prefill` may replace the prefill's cache and hidden state (tests)."""
        greedy = SamplingParams.greedy()
        self._set_pdl()
        self._prefill(prompt, len(codes))
        if after_prefill:
            after_prefill()
        out: list[list[Tensor]] = []
        stream = torch.cuda.current_stream(self.device).cuda_stream
        for f in range(len(codes)):
            frame: list[Tensor] = []

            if self.cp_fused:
                self.forced.copy_(torch.as_tensor(codes[f], dtype=torch.int32))

            def hook(j: int, logits: Tensor, f: int = f, frame: list[Tensor] = frame) -> None:
                frame.append(logits.clone())
                self.cur[j] = int(codes[f, j])

            self._frame_calls(greedy, stream, hook)
            out.append(frame)
        torch.cuda.synchronize(self.device)
        return out

