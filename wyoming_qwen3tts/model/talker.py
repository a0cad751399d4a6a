"""The Talker and CodePredictor transformers in plain torch, batch 1, with a static KV cache (and
one batched case: several prompts prefilled at once into the batched decoder's slots, prefill_rows).

Read top to bottom: RMSNorm and RoPE helpers, one decoder block (Qwen3 style: pre-norm,
per-head q/k RMSNorm, GQA, SwiGLU), the Transformer stack, then the two models built from it:

- Talker: 28 blocks (1.7B: hidden 2048). Text and codec embeddings, the text projection MLP,
  and `codec_head`, which predicts code 0 of each 80 ms frame.
- CodePredictor: 5 blocks (hidden 1024) that fill codes 1..15 of a frame in 15 passes, with
  one input embedding table and one lm_head per code group, and a fresh 16-position cache
  every frame.

Numerics follow the reference so that float32 greedy codes match token for token: norms
compute in float32 and cast back before the weight multiply; RoPE tables are float32 then
cast; attention softmax runs in float32. `Transformer.use_fused_ops` swaps the norms and the
prompt prefill's attention for torch's fused kernels (F.rms_norm, F.scaled_dot_product_attention):
the kernel backend's GPU prefill, where ~2,700 small launches were most of a lone request's
admission; not the reference path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import CodePredictorConfig, Qwen3TTSConfig, TalkerConfig, TransformerConfig
from .layers import rms_norm, rope_tables, rotate_half
from .quant import LinearLayer

M = TypeVar("M", bound=nn.Module)


class ModuleListOf(nn.ModuleList, Generic[M]):
    """An nn.ModuleList whose items are all one kind of module. torch types every ModuleList item as a
    plain Module; this tells the type checker which kind, and is an nn.ModuleList at run time."""

    if TYPE_CHECKING:

        def __init__(self, modules: Iterable[M] | None = None) -> None: ...
        def __iter__(self) -> Iterator[M]: ...
        @overload
        def __getitem__(self, idx: slice) -> ModuleListOf[M]: ...
        @overload
        def __getitem__(self, idx: int) -> M: ...
        def __getitem__(self, idx: int | slice) -> M | ModuleListOf[M]: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        # One fused kernel (F.rms_norm: float32 statistics, the weight multiplied before the one rounding to the
        # input dtype) instead of the reference's eight launches, which round before the weight multiply.
        self.fused = False

    def forward(self, x: Tensor) -> Tensor:
        if self.fused:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x [T, heads, head_dim]; cos/sin [T, head_dim]
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class KVCache:
    """Static cache for one transformer stack: one tensor [layers, 2, max_seq, kv_heads, head_dim].

    One contiguous tensor so that the fused-kernel backend can share it with this torch path.
    Positions at or past `length` may hold stale entries (an earlier request, or the pad rows of
    `Transformer.prefill_bucketed`): every step writes its own positions before attention reads
    positions [0, start + T), so nothing past `length` is ever attended to.
    """

    def __init__(self, cfg: TransformerConfig, max_seq: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.max_seq = max_seq
        self.data = torch.zeros(
            cfg.num_hidden_layers, 2, max_seq, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype, device=device
        )
        self.length = 0  # positions filled

    def reset(self) -> None:
        self.length = 0


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        # q, k and v projections as one matrix (rows q, then k, then v): fused at load (fused_tensors).
        # Each matrix is an nn.Linear, or a QuantLinear once quantize_model ran (model/quant.py).
        self.qkv_proj: LinearLayer = nn.Linear(
            cfg.hidden_size, (self.n_heads + 2 * self.n_kv) * self.head_dim, bias=False
        )
        self.o_proj: LinearLayer = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        # A prefill from position 0 attends through F.scaled_dot_product_attention (causal, GQA; a fused kernel on a
        # GPU) instead of the reference's matmuls, mask and softmax.
        self.fused = False

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, start: int | Tensor, slots: Tensor | None = None
    ) -> Tensor:
        """x [T, hidden] at positions start..start+T-1; cache [2, max_seq, kv_heads, head_dim] of this layer.
        `start` may be a device value (int64 [1]: Transformer.prefill_after): the rows then attend to every cache
        position, masked to those before their own, so a captured graph serves any start.

        With `slots` (int64 [B]): x [B, T, hidden], B prompts at positions 0..T-1 (start 0), each
        right-padded to T; cache is this layer of a slot-major cache [slots, 2, max_seq, kv_heads,
        head_dim] and row b's K/V go to slot slots[b] (Transformer.prefill_rows). The rows attend to
        their own new K/V only: a prefill from position 0 has nothing cached before it.
        """
        t = x.shape[-2]
        q, k, v = self.qkv_proj(x).split([self.n_heads * self.head_dim, *[self.n_kv * self.head_dim] * 2], dim=-1)
        q = self.q_norm(q.unflatten(-1, (self.n_heads, self.head_dim)))
        k = self.k_norm(k.unflatten(-1, (self.n_kv, self.head_dim)))
        v = v.unflatten(-1, (self.n_kv, self.head_dim))
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        # A prefill from position 0 on the fused attention: the keys are the new block itself, so the mask is the
        # causal one (is_causal), and none is built.
        fused = self.fused and t > 1 and not isinstance(start, Tensor) and start == 0
        mask: Tensor | None = None
        if isinstance(start, Tensor):
            positions = start + torch.arange(t, device=x.device)
            cache[0].index_copy_(0, positions, k)
            cache[1].index_copy_(0, positions, v)
            keys, values = cache[0], cache[1]
            mask = torch.arange(cache.shape[1], device=x.device)[None, :] <= positions[:, None]
        elif slots is None:
            end = start + t
            cache[0, start:end] = k
            cache[1, start:end] = v
            keys, values = cache[0, :end], cache[1, :end]
            if t > 1 and not fused:  # causal within the new block; everything cached before `start` is visible
                mask = torch.ones(t, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
        else:
            if start != 0:
                raise ValueError("a prefill of several prompts starts at position 0")
            cache[:, 0, :t].index_copy_(0, slots, k)
            cache[:, 1, :t].index_copy_(0, slots, v)
            keys, values = k, v
            if t > 1 and not fused:
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        if fused:
            qh, kh, vh = (m.transpose(-3, -2) for m in (q, k, v))  # [..., heads, T, hd]
            if slots is None:
                qh, kh, vh = qh[None], kh[None], vh[None]
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=self.head_dim**-0.5, enable_gqa=True)
            out = out.transpose(-3, -2).flatten(-2)
            return self.o_proj(out[0] if slots is None else out)
        keys = keys.transpose(-3, -2)  # [..., kv, S, hd]
        values = values.transpose(-3, -2)
        group = self.n_heads // self.n_kv
        keys = keys.repeat_interleave(group, dim=-3)  # [..., heads, S, hd]
        values = values.repeat_interleave(group, dim=-3)
        q = q.transpose(-3, -2)  # [..., heads, T, hd]
        scores = torch.matmul(q, keys.transpose(-2, -1)) * (self.head_dim**-0.5)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, values).transpose(-3, -2).flatten(-2)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        # gate and up projections as one matrix, rows interleaved (gate_0, up_0, gate_1, ...), so the
        # fused kernels compute SwiGLU in one pass over it: fused at load (fused_tensors).
        self.gate_up_proj: LinearLayer = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj: LinearLayer = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj(x).unflatten(-1, (-1, 2))
        return self.down_proj(F.silu(gate_up[..., 0]) * gate_up[..., 1])


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, start: int | Tensor, slots: Tensor | None = None
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, start, slots)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """A stack of blocks plus the final norm; returns final-normed hidden states."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = ModuleListOf(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def use_fused_ops(self, fused: bool = True) -> None:
        """Every norm of the stack on F.rms_norm and a prefill's attention from position 0 on
        F.scaled_dot_product_attention (see the module's docstring), or back to the reference's ops."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention)):
                module.fused = fused

    def forward(self, x: Tensor, cache: KVCache) -> Tensor:
        start = cache.length
        t = x.shape[0]
        if start + t > cache.max_seq:
            raise RuntimeError(f"KV cache full: {start + t} positions > {cache.max_seq}")
        positions = torch.arange(start, start + t, device=x.device)
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.data[i], start)
        cache.length = start + t
        return self.norm(x)

    def prefill_bucketed(self, x: Tensor, cache: KVCache, bucket: int, last: Tensor | None = None) -> Tensor:
        """forward() over x [L, H] right-padded with zero rows to `bucket` positions; returns the
        final-normed hidden state of the last real position [1, H] and leaves cache.length at start + L.
        With `last` (int64 [1] on the device) it returns row last[0] instead: a captured graph of this
        call, x its static [bucket, H] input zero past the prompt, then serves every prompt length in
        the bucket (the caller sets cache.length after each replay).

        Why it equals forward(x) (up to rounding): attention is causal, so positions < L never see
        the pads; the pads' K/V land in cache positions start+L .. start+bucket-1, past `length`,
        where the next steps overwrite them before reading (see KVCache). Zero pad inputs keep the
        pad rows finite (RMSNorm of 0 is 0), so they add exact zeros, not NaNs, to masked sums.
        Not bitwise equal: the matmuls run with M = bucket instead of L, and BLAS may block and
        sum differently. The fixed shape is what lets a captured CUDA graph serve every prompt
        length up to `bucket` (backends/kernels/prefill.py).
        """
        n = x.shape[0]
        if not 0 < n <= bucket:
            raise ValueError(f"bucket {bucket} cannot hold {n} positions")
        start = cache.length
        padded = x.new_zeros(bucket, x.shape[1])
        padded[:n] = x
        h = self.forward(padded, cache)  # raises if start + bucket > cache.max_seq
        cache.length = start + n
        return h[n - 1 : n] if last is None else h.index_select(0, last)

    def prefill_after(self, x: Tensor, cache: KVCache, start: Tensor, last: Tensor) -> Tensor:
        """forward() of x [T, H] at positions start..start+T-1 behind what the cache holds before `start`, with start
        and last (the row whose final-normed hidden state is returned, [1, H]) int64 [1] on the device: no host
        value, so one captured graph per T serves any start (backends/kernels/prefill.py: a prompt after its
        voice's cached prefix). Every row attends to all max_seq cache positions, masked to those up to its own,
        so stale K/V past them (and the zero pad rows past the prompt, written past its end) are never read.
        Leaves cache.length alone (the caller knows the real end). The caller keeps start + T <= max_seq."""
        positions = start + torch.arange(x.shape[0], device=x.device)
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.data[i], start)
        return self.norm(x.index_select(0, last))

    def prefill_rows(self, prompts: list[Tensor], cache: Tensor, slots: Tensor, last: Tensor | None = None) -> Tensor:
        """Several prompts in one forward, each from position 0 into its own slot of a slot-major cache
        (the batched decoder's): prompts [L_b, H] each, cache [slots, layers, 2, max_seq, kv_heads,
        head_dim], slots int64 [B] on the cache's device, one per prompt. Returns the final-normed
        hidden state of each prompt's last position [B, H] (last: those positions, int64 [B] on the
        cache's device, if the caller has them there). Only the given slots' positions 0..max(L_b)-1
        are written.

        The prompts are stacked right-padded with zero rows to the longest. Why row b equals
        forward() of its prompt alone (up to rounding): attention is causal, so a row's positions
        < L_b never see its pads; the pads' K/V land in the slot's positions L_b .. T-1, which the
        decode steps overwrite before they read them (the step at position p writes p and attends
        to [0, p]: KVCache, and the batched kernels' q3t_batched_rope_attention_split). Zero pad
        inputs keep the pad rows finite. Not bitwise equal: the matmuls run with B * T rows instead
        of L_b, and BLAS may block and sum differently.
        """
        lengths = [p.shape[0] for p in prompts]
        x = prompts[0].new_zeros(len(prompts), max(lengths), prompts[0].shape[1])
        for b, p in enumerate(prompts):
            x[b, : lengths[b]] = p
        if last is None:
            last = torch.tensor([n - 1 for n in lengths], device=x.device)
        return self.prefill_padded(x, cache, slots, last)

    def prefill_padded(self, x: Tensor, cache: Tensor, slots: Tensor, last: Tensor) -> Tensor:
        """prefill_rows on prompts already stacked and right-padded: x [B, T, H]; last int64 [B] on x's
        device, each row's last real position. Takes no host values, so a captured graph replays it for
        any prompts that fit its T (backends/kernels/prefill.py)."""
        t = x.shape[1]
        if t > cache.shape[3]:
            raise RuntimeError(f"KV cache full: {t} positions > {cache.shape[3]}")
        cos, sin = rope_tables(torch.arange(t, device=x.device), self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache[:, i], 0, slots)
        return self.norm(x[torch.arange(x.shape[0], device=x.device), last])


# Prompt lengths are padded up to one of these for prefill_bucketed (8 + 12 = 20 buckets at most).
PREFILL_BUCKETS = tuple(range(16, 129, 16)) + tuple(range(160, 513, 32))


def prefill_bucket(length: int, capacity: int) -> int | None:
    """The bucket a prompt of `length` positions is padded to, or None (past the largest bucket or
    the cache's capacity): prefill it as it is."""
    for bucket in PREFILL_BUCKETS:
        if bucket >= length:
            return bucket if bucket <= capacity else None
    return None


class TalkerStack(Transformer):
    """The Talker's transformer with its two input tables (checkpoint keys `talker.model.*`)."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__(cfg)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class CodePredictorStack(Transformer):
    """The CodePredictor's transformer with one input table per code 1..15 (`talker.code_predictor.model.*`)."""

    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__(cfg)
        # Input tables have the talker's width; the projection maps them to the predictor's.
        groups = cfg.num_code_groups - 1
        self.codec_embedding = ModuleListOf(nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(groups))


class TextProjection(nn.Module):
    """Text embedding width -> talker width: Linear + SiLU + Linear, with biases."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class CodePredictor(nn.Module):
    """Fills codes 1..15 of a frame from the Talker's hidden state and code 0."""

    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        groups = cfg.num_code_groups - 1
        self.model = CodePredictorStack(cfg, talker_hidden)
        self.lm_head: ModuleListOf[LinearLayer] = ModuleListOf(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(groups)
        )
        self.small_to_mtp_projection: LinearLayer | nn.Identity = (
            nn.Linear(talker_hidden, cfg.hidden_size, bias=True) if talker_hidden != cfg.hidden_size else nn.Identity()
        )

    def project(self, x: Tensor) -> Tensor:
        return self.small_to_mtp_projection(x)


class Talker(nn.Module):
    """Module tree mirrors the checkpoint's `talker.*` keys so the state dict loads by name."""

    def __init__(self, cfg: TalkerConfig, cp_cfg: CodePredictorConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerStack(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head: LinearLayer = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cp_cfg, cfg.hidden_size)

    def embed_text(self, ids: Tensor | list[int]) -> Tensor:
        """Et(ids): text embedding then projection to the talker width. ids [T] -> [T, H].

        The 151936-row text table may live in host memory (only prompt rows are ever read):
        gather there, project on the model's device. Ids given as a list go straight to the
        table's device: ids made on the GPU for a host table cost a device sync to bring back.
        """
        table = self.model.text_embedding.weight
        ids = torch.as_tensor(ids, dtype=torch.long).to(table.device)
        rows = F.embedding(ids, table)
        return self.text_projection(rows.to(self.model.norm.weight.device))

    def embed_codec(self, ids: Tensor) -> Tensor:
        return self.model.codec_embedding(ids)


class Qwen3TTSModel(nn.Module):
    """The whole Talker side of a CustomVoice checkpoint (the codec decoder lives in codec.py)."""

    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.talker = Talker(cfg.talker, cfg.code_predictor)

    @classmethod
    def from_tensors(
        cls, cfg: Qwen3TTSConfig, tensors: dict[str, Tensor], *, dtype: torch.dtype, device: torch.device | str
    ) -> Qwen3TTSModel:
        with torch.device("meta"):
            model = cls(cfg)
        expected = set(model.state_dict().keys())
        given = {k: v for k, v in tensors.items() if k.startswith("talker.")}
        fusions = _fusions(given)
        names = set(given) - {part for parts in fusions.values() for part in parts} | set(fusions)
        missing = sorted(expected - names)
        unexpected = sorted(names - expected)
        if missing or unexpected:
            raise ValueError(
                "checkpoint weights do not match the config: "
                f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
            )
        # On a GPU the text embedding table (0.6 GB at bf16, read only at prompt time) stays in
        # host memory; everything else moves to the device.
        host_table = torch.device(device).type != "cpu"
        text_key = "talker.model.text_embedding.weight"
        state = {
            k: v.to(device="cpu" if (host_table and k == text_key) else device, dtype=dtype)
            for k, v in fused_tensors(given, fusions)
        }
        model.load_state_dict(state, assign=True)
        return model.eval()

    # Read from a norm weight: the matrices may be int8 (model/quant.py), the norms always hold the model's dtype.
    @property
    def dtype(self) -> torch.dtype:
        return self.talker.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.talker.model.norm.weight.device

    def new_talker_cache(self, max_seq: int) -> KVCache:
        return KVCache(self.cfg.talker, max_seq, self.dtype, self.device)

    def new_predictor_cache(self) -> KVCache:
        return KVCache(self.cfg.code_predictor, self.cfg.code_predictor.num_code_groups, self.dtype, self.device)


def _interleave_rows(ws: list[Tensor]) -> Tensor:
    return torch.stack(ws, 1).flatten(0, 1)


# Per block: fused weight -> the checkpoint's weights it is made of, and how.
_FUSED: dict[str, tuple[tuple[str, ...], Callable[[list[Tensor]], Tensor]]] = {
    "self_attn.qkv_proj.weight": (
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        torch.cat,
    ),
    "mlp.gate_up_proj.weight": (("mlp.gate_proj.weight", "mlp.up_proj.weight"), _interleave_rows),
}


def _fusions(tensors: dict[str, Tensor]) -> dict[str, list[str]]:
    """Fused weight name -> checkpoint names, for every block whose parts are all in `tensors`."""
    out = {}
    for name in tensors:
        for fused, (parts, _) in _FUSED.items():
            if name.endswith("." + parts[0]):
                prefix = name[: -len(parts[0])]
                names = [prefix + p for p in parts]
                if all(n in tensors for n in names):
                    out[prefix + fused] = names
    return out


def fused_tensors(tensors: dict[str, Tensor], fusions: dict[str, list[str]]) -> Iterator[tuple[str, Tensor]]:
    """The checkpoint's tensors with each block's q/k/v concatenated and gate/up interleaved row by
    row, one fused weight at a time (so the caller can move each to the device before the next)."""
    parts = {n for names in fusions.values() for n in names}
    for name, t in tensors.items():
        if name not in parts:
            yield name, t
    for fused, names in fusions.items():
        combine = next(how for suffix, (_, how) in _FUSED.items() if fused.endswith(suffix))
        yield fused, combine([tensors[n] for n in names])


__all__ = ["Qwen3TTSModel", "KVCache", "apply_rope"]
