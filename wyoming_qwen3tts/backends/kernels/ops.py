"""Typed wrappers over the q3t C ABI: one method per entry point, taking tensors and named arguments.

Shapes, dtypes and pointers are read off the tensors, so a call site names only what it decides
(mode, eps, positions, sampling settings). The launches are asynchronous on `stream` (a CUDA/HIP
stream handle; None: torch's current stream), never synchronise and never allocate, so they can be
captured into a graph; a failed launch raises library.NativeError with the runtime's message.
What each entry point computes is documented once, in kernels/include/q3t.h.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from . import library

STORE, ADD, SWIGLU = library.GEMV_STORE, library.GEMV_ADD, library.GEMV_SWIGLU


def dtype_code(dtype: torch.dtype) -> int:
    """q3t's code for a weight / KV-cache dtype (int8: GEMV matrices only, with their row scales)."""
    if dtype == torch.float32:
        return library.F32
    if dtype == torch.bfloat16:
        return library.BF16
    if dtype == torch.int8:
        return library.I8
    raise library.NativeUnavailable(f"the kernels take float32, bfloat16 or (GEMV matrices) int8, not {dtype}")


@dataclass(frozen=True)
class Matrix:
    """A GEMV's weight matrix: `data` [N, K] (float32, bf16, or int8 with `scale`, float32 [N]: row n
    stands for data[n] * scale[n], model/quant.py's QuantLinear)."""

    data: Tensor
    scale: Tensor | None = None

    def __post_init__(self) -> None:
        if (self.data.dtype == torch.int8) != (self.scale is not None):
            raise ValueError(f"a {self.data.dtype} matrix {'needs' if self.scale is None else 'takes no'} row scales")
        if self.scale is not None and (self.scale.dtype != torch.float32 or self.scale.shape != self.data.shape[:1]):
            raise ValueError(
                f"row scales must be float32 [{self.data.shape[0]}], not {self.scale.dtype} {tuple(self.scale.shape)}"
            )

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype


def _matrix(w: Tensor | Matrix) -> tuple[int, int, int | None]:
    """(dtype code, data pointer, scale pointer or None) of a weight matrix."""
    if isinstance(w, Matrix):
        return dtype_code(w.dtype), w.data.data_ptr(), _ptr(w.scale)
    if w.dtype == torch.int8:
        raise ValueError("an int8 matrix goes with its row scales: pass a Matrix")
    return dtype_code(w.dtype), w.data_ptr(), None


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stream(stream: int | None) -> int:
    return torch.cuda.current_stream().cuda_stream if stream is None else stream


class Ops:
    """The q3t entry points of one loaded library."""

    def __init__(self, lib: library.Native) -> None:
        self.lib = lib

    def set_pdl(self, enable: bool) -> None:
        """Programmatic dependent launch for launches (and captures) from now on; raises
        library.NativeError where the device has none (HIP, or CUDA before sm_90)."""
        self.lib.call("q3t_set_pdl", int(enable))

    def set_gemv_clusters(self, enable: bool) -> None:
        """The tensor-core batched GEMV's split K across thread-block clusters (where it can) or through global
        scratch (the same bits), for launches and captures from now on (one flag for the whole library)."""
        self.lib.call("q3t_set_gemv_clusters", int(enable))

    def set_gemv_groups(self, enable: bool) -> None:
        """The tensor-core batched GEMV taking more than 16 vectors in one launch (16 at a time inside each block)
        or in launches of 16 (the same bits), for launches and captures from now on (one flag for the library)."""
        self.lib.call("q3t_set_gemv_groups", int(enable))

    def set_i8_deep(self, enable: bool) -> None:
        """The split-K GEMV's int8 plan: the most loads in flight per lane (q3t_set_i8_deep), for launches and
        captures from now on (one flag for the library)."""
        self.lib.call("q3t_set_i8_deep", int(enable))

    def set_i8_mma(self, enable: bool) -> None:
        """int8 one- and two-vector GEMVs on int8 tensor cores (q3t_set_i8_mma; CUDA sm_80+) or on the FMA kernels,
        for launches and captures from now on (one flag for the library)."""
        self.lib.call("q3t_set_i8_mma", int(enable))

    def use_pdl(self, want: bool) -> bool:
        """set_pdl(want) where the device has PDL, else off; returns whether it is on. Launches and captures
        take the setting current when they are made (one flag for the whole library)."""
        try:
            self.set_pdl(want)
            return want
        except library.NativeError:  # HIP, or a CUDA device before sm_90
            self.set_pdl(False)
            return False

    def rmsnorm(self, x: Tensor, weight: Tensor, out: Tensor, *, eps: float, stream: int | None = None) -> None:
        self.lib.call("q3t_rmsnorm", x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel(), eps, _stream(stream))

    def gemv(
        self,
        w: Tensor | Matrix,
        x: Tensor,
        y: Tensor,
        *,
        mode: int = STORE,
        norm_w: Tensor | None = None,
        eps: float = 0.0,
        bias: Tensor | None = None,
        stream: int | None = None,
    ) -> None:
        """y (mode) w [N, K] @ x [K], x RMS-normed with norm_w first when given."""
        n, k = w.shape
        code, w_ptr, scale_ptr = _matrix(w)
        self.lib.call(
            "q3t_gemv",
            code,
            w_ptr,
            scale_ptr,
            n,
            k,
            x.data_ptr(),
            _ptr(norm_w),
            eps,
            _ptr(bias),
            y.data_ptr(),
            mode,
            _stream(stream),
        )

    def gemv_batch(
        self,
        w: Tensor | Matrix,
        x: Tensor,
        y: Tensor,
        *,
        mode: int = STORE,
        norm_w: Tensor | None = None,
        eps: float = 0.0,
        bias: Tensor | None = None,
        stream: int | None = None,
    ) -> None:
        """gemv for each row of x [nb, K] into the rows of y, each weight row read once."""
        n, k = w.shape
        code, w_ptr, scale_ptr = _matrix(w)
        self.lib.call(
            "q3t_gemv_batch",
            code,
            w_ptr,
            scale_ptr,
            n,
            k,
            x.data_ptr(),
            x.shape[0],
            _ptr(norm_w),
            eps,
            _ptr(bias),
            y.data_ptr(),
            mode,
            _stream(stream),
        )

    def rope_attention_split(
        self,
        qkv: Tensor,
        q_norm: Tensor,
        k_norm: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        out: Tensor,
        *,
        eps: float,
        scale: float,
        splits: int,
        scratch: Tensor | None,
        pos: Tensor | None = None,
        pos_add: int = 0,
        stream: int | None = None,
    ) -> None:
        """The Talker's attention step at position (pos[0] if pos else 0) + pos_add; caches
        [max_seq, kv_heads, head_dim], scratch as q3t.h says (None with one split)."""
        max_seq, hkv, d = k_cache.shape
        self.lib.call(
            "q3t_rope_attention_split",
            dtype_code(k_cache.dtype),
            qkv.data_ptr(),
            q_norm.data_ptr(),
            k_norm.data_ptr(),
            eps,
            cos.data_ptr(),
            sin.data_ptr(),
            _ptr(pos),
            pos_add,
            out.numel() // d,
            hkv,
            d,
            max_seq,
            scale,
            splits,
            _ptr(scratch),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            out.data_ptr(),
            _stream(stream),
        )

    def rope_attention(
        self,
        qkv: Tensor,
        q_norm: Tensor,
        k_norm: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        out: Tensor,
        *,
        eps: float,
        scale: float,
        pos: Tensor | None = None,
        pos_add: int = 0,
        stream: int | None = None,
    ) -> None:
        """The same step for a short cache (the CodePredictor's), in one block per head."""
        max_seq, hkv, d = k_cache.shape
        self.lib.call(
            "q3t_rope_attention",
            dtype_code(k_cache.dtype),
            qkv.data_ptr(),
            q_norm.data_ptr(),
            k_norm.data_ptr(),
            eps,
            cos.data_ptr(),
            sin.data_ptr(),
            _ptr(pos),
            pos_add,
            out.numel() // d,
            hkv,
            d,
            max_seq,
            scale,
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            out.data_ptr(),
            _stream(stream),
        )

    def rope_attention_first(
        self,
        qkv: Tensor,
        q_norm: Tensor,
        k_norm: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        out: Tensor,
        *,
        eps: float,
        scale: float,
        stream: int | None = None,
    ) -> None:
        """rope_attention at positions 0..n-1 of an empty short cache: qkv [n, ...] -> out [n, hq * d]."""
        max_seq, hkv, d = k_cache.shape
        n = qkv.shape[0]
        self.lib.call(
            "q3t_rope_attention_first",
            dtype_code(k_cache.dtype),
            qkv.data_ptr(),
            q_norm.data_ptr(),
            k_norm.data_ptr(),
            eps,
            cos.data_ptr(),
            sin.data_ptr(),
            n,
            out.numel() // (n * d),
            hkv,
            d,
            max_seq,
            scale,
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            out.data_ptr(),
            _stream(stream),
        )

    def embed_row(self, table: Tensor, token: Tensor, out: Tensor, *, stream: int | None = None) -> None:
        """out = table [rows, h] row token[0], as float32."""
        rows, h = table.shape
        self.lib.call(
            "q3t_embed_row",
            dtype_code(table.dtype),
            table.data_ptr(),
            rows,
            h,
            token.data_ptr(),
            out.data_ptr(),
            _stream(stream),
        )

    def embed_sum(
        self,
        tables: Sequence[Tensor],
        table_ptrs: Tensor,
        codes: Tensor,
        trailing: Tensor,
        pad: Tensor,
        step: Tensor,
        out: Tensor,
        *,
        stream: int | None = None,
    ) -> None:
        """out = sum_j tables[j][codes[j]] + (trailing[step] if step < len(trailing) else pad);
        table_ptrs: the tables' data pointers as an int64 device array (kept alive by the caller)."""
        if table_ptrs.numel() != len(tables):
            raise ValueError(f"{len(tables)} tables but {table_ptrs.numel()} pointers")
        rows_first, h = tables[0].shape
        rows = tables[1].shape[0] if len(tables) > 1 else rows_first
        self.lib.call(
            "q3t_embed_sum",
            dtype_code(tables[0].dtype),
            table_ptrs.data_ptr(),
            len(tables),
            rows_first,
            rows,
            h,
            codes.data_ptr(),
            trailing.data_ptr(),
            trailing.shape[0],
            pad.data_ptr(),
            step.data_ptr(),
            out.data_ptr(),
            _stream(stream),
        )

    def sample(
        self,
        logits: Tensor,
        out_code: Tensor,
        *,
        seen: Tensor | None = None,
        penalty: float = 1.0,
        eos: int = -1,
        min_new_tokens: int = 0,
        suppress: tuple[int, int] = (0, 0),
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: Tensor | None = None,
        stream_id: int = 0,
        step: Tensor | None = None,
        row_table: Tensor | None = None,
        row_out: Tensor | None = None,
        stream: int | None = None,
    ) -> None:
        """Logits processing and one draw into out_code[0]; with row_table, row_out = its drawn row."""
        row_dtype, rows, h = (0, 0, 0) if row_table is None else (dtype_code(row_table.dtype), *row_table.shape)
        self.lib.call(
            "q3t_sample",
            logits.data_ptr(),
            logits.numel(),
            _ptr(seen),
            penalty,
            eos,
            min_new_tokens,
            suppress[0],
            suppress[1],
            library.SAMPLE_DO_SAMPLE if do_sample else 0,
            temperature,
            top_k,
            top_p,
            _ptr(seed),
            stream_id,
            _ptr(step),
            out_code.data_ptr(),
            row_dtype,
            _ptr(row_table),
            rows,
            h,
            _ptr(row_out),
            _stream(stream),
        )

    def cp_passes(
        self,
        layers: Sequence[Sequence[Tensor]],
        heads: Sequence[Tensor],
        inputs: Sequence[Tensor],
        *,
        first: int,
        last: int,
        eps: float,
        scale: float,
        final_norm: Tensor,
        cos: Tensor,
        sin: Tensor,
        x: Tensor,
        qkv: Tensor,
        attn: Tensor,
        mlp: Tensor,
        logits: Tensor,
        codes: Tensor,
        sync: Tensor,
        do_sample: bool,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: Tensor | None,
        step: Tensor | None,
        slot: Tensor | None = None,
        params: Tensor | None = None,
        trace: Tensor | None = None,
        stream: int | None = None,
    ) -> None:
        """CodePredictor positions first..last in one persistent launch (q3t_cp_passes): layers are the
        10-tuples (in_norm, qkv, q_norm, k_norm, o, post_norm, gate_up, down, k_cache, v_cache); heads and
        inputs the lm_heads and input tables of positions 1..15. With slot (a batched decoder's stream), the
        draw's settings are params[slot] and its seed and frame seed[slot] and step[slot]. trace: int64, q3t.h's
        clock marks (device scripts)."""
        if len(heads) != 15 or len(inputs) != 15 or any(len(L) != 10 for L in layers):
            raise ValueError("cp_passes: 10 tensors a layer and 15 heads and input tables")
        k_cache = layers[0][8]
        max_seq, hkv, d = k_cache.shape
        hidden = layers[0][0].numel()
        hq = attn.numel() // d
        ptrs = (ctypes.c_void_p * (10 * len(layers)))(*(t.data_ptr() for L in layers for t in L))
        head_ptrs = (ctypes.c_void_p * 15)(*(t.data_ptr() for t in heads))
        input_ptrs = (ctypes.c_void_p * 15)(*(t.data_ptr() for t in inputs))
        self.lib.call(
            "q3t_cp_passes",
            dtype_code(layers[0][1].dtype),
            ptrs,
            len(layers),
            head_ptrs,
            input_ptrs,
            dtype_code(inputs[0].dtype),
            first,
            last,
            hidden,
            mlp.numel(),
            hq,
            hkv,
            d,
            max_seq,
            logits.numel(),
            eps,
            scale,
            final_norm.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            x.data_ptr(),
            qkv.data_ptr(),
            attn.data_ptr(),
            mlp.data_ptr(),
            logits.data_ptr(),
            codes.data_ptr(),
            library.SAMPLE_DO_SAMPLE if do_sample else 0,
            temperature,
            top_k,
            top_p,
            _ptr(slot),
            _ptr(params),
            _ptr(seed),
            _ptr(step),
            sync.data_ptr(),
            _ptr(trace),
            _stream(stream),
        )

    def store_row(self, src: Tensor, dst: Tensor, row: Tensor, *, stream: int | None = None) -> None:
        """dst [max_rows, n][row[0]] = src [n], skipped when row[0] is outside dst."""
        self.lib.call(
            "q3t_store_row", src.data_ptr(), src.numel(), dst.data_ptr(), row.data_ptr(), dst.shape[0], _stream(stream)
        )

    def add_i32(self, counters: Tensor, delta: int, *, stream: int | None = None) -> None:
        """counters += delta on the device (int32)."""
        self.lib.call("q3t_add_i32", counters.data_ptr(), counters.numel(), delta, _stream(stream))

    def snake_beta(self, x: Tensor, alpha: Tensor, inv_beta: Tensor, out: Tensor, *, stream: int | None = None) -> None:
        """out = x + inv_beta * sin(x * alpha)^2 (the codec's SnakeBeta, model/codec.py) for x and out [B, C, T]
        (either may be a strided view with the last stride 1: out may be a slice of the conv's input buffer),
        alpha and inv_beta holding C values; each op rounded to the dtype as torch's are."""
        if x.dim() != 3 or out.shape != x.shape or x.stride(-1) != 1 or out.stride(-1) != 1:
            raise ValueError(f"snake_beta wants x and out [B, C, T] with unit last strides, got {x.shape}, {out.shape}")
        b, c, t = x.shape
        if not (alpha.is_contiguous() and inv_beta.is_contiguous() and alpha.numel() == c == inv_beta.numel()):
            raise ValueError(f"snake_beta wants {c} contiguous alphas and betas, got {alpha.shape}, {inv_beta.shape}")
        if not x.dtype == out.dtype == alpha.dtype == inv_beta.dtype:
            raise ValueError(f"snake_beta wants one dtype, got {x.dtype}, {out.dtype}, {alpha.dtype}, {inv_beta.dtype}")
        if t == 0 or b == 0:
            return
        self.lib.call(
            "q3t_snake_beta",
            dtype_code(x.dtype),
            x.data_ptr(),
            x.stride(0),
            x.stride(1),
            alpha.data_ptr(),
            inv_beta.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            out.stride(1),
            b,
            c,
            t,
            _stream(stream),
        )

    # -- the batched decode step: nb <= 16 rows (streams), per-slot state (q3t.h, last section) ------------

    def batched_gemv(
        self,
        w: Tensor | Matrix,
        x: Tensor,
        y: Tensor,
        *,
        mode: int = STORE,
        norm_w: Tensor | None = None,
        eps: float = 0.0,
        bias: Tensor | None = None,
        scratch: Tensor | None = None,
        stream: int | None = None,
    ) -> None:
        """gemv for each row of x [nb, K] into y [nb, ...], each weight row read once for all rows,
        each row's sums in an order that does not depend on nb or the other rows. With `scratch`
        (float32, zeroed once, batched_gemv_scratch_floats long) bf16 and int8 weights take the
        tensor-core kernel where the device has one."""
        n, k = w.shape
        code, w_ptr, scale_ptr = _matrix(w)
        self.lib.call(
            "q3t_batched_gemv",
            code,
            w_ptr,
            scale_ptr,
            n,
            k,
            x.data_ptr(),
            x.shape[0],
            _ptr(norm_w),
            eps,
            _ptr(bias),
            y.data_ptr(),
            mode,
            _ptr(scratch),
            0 if scratch is None else scratch.numel(),
            _stream(stream),
        )

    def batched_gemv_scratch_floats(self, weights: Sequence[Tensor | Matrix]) -> int:
        """The scratch (float32 elements) batched_gemv needs for every one of these matrices."""
        need = 0
        for n, k, code in {(w.shape[0], w.shape[1], dtype_code(w.dtype)) for w in weights}:
            got = self.lib.lib.q3t_batched_gemv_scratch_floats(code, n, k)
            if got < 0:
                raise library.NativeError(f"q3t_batched_gemv_scratch_floats: {self.lib.last_error()}")
            need = max(need, got)
        return need

    def batched_rope_attention_split(
        self,
        qkv: Tensor,
        q_norm: Tensor,
        k_norm: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        out: Tensor,
        *,
        slot: Tensor,
        pos: Tensor,
        slot_rows: int,
        eps: float,
        scale: float,
        splits: int,
        scratch: Tensor | None,
        stream: int | None = None,
    ) -> None:
        """The Talker's attention step for rows qkv [nb, ...]: row r in slot slot[r]'s cache at position
        pos[slot[r]]; k_cache / v_cache [max_seq, kv_heads, head_dim] are slot 0's views of this layer,
        slot s's lying slot_rows cache rows further on."""
        max_seq, hkv, d = k_cache.shape
        nb = qkv.shape[0]
        self.lib.call(
            "q3t_batched_rope_attention_split",
            dtype_code(k_cache.dtype),
            qkv.data_ptr(),
            q_norm.data_ptr(),
            k_norm.data_ptr(),
            eps,
            cos.data_ptr(),
            sin.data_ptr(),
            slot.data_ptr(),
            pos.data_ptr(),
            nb,
            out.numel() // (nb * d),
            hkv,
            d,
            max_seq,
            scale,
            splits,
            _ptr(scratch),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            slot_rows,
            out.data_ptr(),
            _stream(stream),
        )

    def batched_rope_attention(
        self,
        qkv: Tensor,
        q_norm: Tensor,
        k_norm: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        out: Tensor,
        *,
        row_rows: int,
        eps: float,
        scale: float,
        pos: Tensor | None = None,
        pos_add: int = 0,
        stream: int | None = None,
    ) -> None:
        """The short (CodePredictor) attention for rows qkv [nb, ...], all at position (pos[0] if pos) +
        pos_add; row r's cache lies r * row_rows cache rows past row 0's views k_cache / v_cache."""
        max_seq, hkv, d = k_cache.shape
        nb = qkv.shape[0]
        self.lib.call(
            "q3t_batched_rope_attention",
            dtype_code(k_cache.dtype),
            qkv.data_ptr(),
            q_norm.data_ptr(),
            k_norm.data_ptr(),
            eps,
            cos.data_ptr(),
            sin.data_ptr(),
            _ptr(pos),
            pos_add,
            nb,
            out.numel() // (nb * d),
            hkv,
            d,
            max_seq,
            scale,
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            row_rows,
            out.data_ptr(),
            _stream(stream),
        )

    def batched_rope_attention_first(
        self,
        qkv: Tensor,
        q_norm: Tensor,
        k_norm: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        out: Tensor,
        *,
        row_rows: int,
        eps: float,
        scale: float,
        stream: int | None = None,
    ) -> None:
        """rope_attention_first for rows qkv [nb, n, ...] -> out [nb, n, hq * d], row caches as above."""
        max_seq, hkv, d = k_cache.shape
        nb, n = qkv.shape[0], qkv.shape[1]
        self.lib.call(
            "q3t_batched_rope_attention_first",
            dtype_code(k_cache.dtype),
            qkv.data_ptr(),
            q_norm.data_ptr(),
            k_norm.data_ptr(),
            eps,
            cos.data_ptr(),
            sin.data_ptr(),
            n,
            nb,
            out.numel() // (nb * n * d),
            hkv,
            d,
            max_seq,
            scale,
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            row_rows,
            out.data_ptr(),
            _stream(stream),
        )

    def batched_sample(
        self,
        logits: Tensor,
        out_codes: Tensor,
        *,
        slot: Tensor,
        params: Tensor,
        seed: Tensor,
        step: Tensor,
        seen: Tensor | None = None,
        suppress: tuple[int, int] = (0, 0),
        stream_id: int = 0,
        out_stride: int = 1,
        row_table: Tensor | None = None,
        row_out: Tensor | None = None,
        row_stride: int = 0,
        stream: int | None = None,
    ) -> None:
        """One draw per row of logits [nb, v] with its slot's params (library.SAMPLE_PARAMS_DTYPE records,
        as a uint8 device array), seed and step into out_codes[r * out_stride]; seen [slots, v] (the
        penalty's code-0 sets) or None; with row_table, row_out[r * row_stride:] = its drawn row."""
        nb, v = logits.shape
        row_dtype, rows, h = (0, 0, 0) if row_table is None else (dtype_code(row_table.dtype), *row_table.shape)
        self.lib.call(
            "q3t_batched_sample",
            logits.data_ptr(),
            v,
            nb,
            slot.data_ptr(),
            params.data_ptr(),
            seed.data_ptr(),
            step.data_ptr(),
            _ptr(seen),
            suppress[0],
            suppress[1],
            stream_id,
            out_codes.data_ptr(),
            out_stride,
            row_dtype,
            _ptr(row_table),
            rows,
            h,
            _ptr(row_out),
            row_stride,
            _stream(stream),
        )

    def batched_embed_sum(
        self,
        tables: Sequence[Tensor],
        table_ptrs: Tensor,
        codes: Tensor,
        out: Tensor,
        *,
        slot: Tensor,
        trailing: Tensor,
        n_trailing: Tensor,
        pad: Tensor,
        step: Tensor,
        stream: int | None = None,
    ) -> None:
        """embed_sum for rows codes [nb, n_tables] -> out [nb, h], each with its slot's trailing text
        (trailing [slots, max_trailing, h], n_trailing [slots]) and pad [slots, h]."""
        if table_ptrs.numel() != len(tables):
            raise ValueError(f"{len(tables)} tables but {table_ptrs.numel()} pointers")
        rows_first, h = tables[0].shape
        rows = tables[1].shape[0] if len(tables) > 1 else rows_first
        self.lib.call(
            "q3t_batched_embed_sum",
            dtype_code(tables[0].dtype),
            table_ptrs.data_ptr(),
            len(tables),
            rows_first,
            rows,
            h,
            codes.data_ptr(),
            codes.shape[0],
            slot.data_ptr(),
            trailing.data_ptr(),
            trailing.shape[1],
            n_trailing.data_ptr(),
            pad.data_ptr(),
            step.data_ptr(),
            out.data_ptr(),
            _stream(stream),
        )

    def batched_rmsnorm(self, x: Tensor, weight: Tensor, out: Tensor, *, eps: float, stream: int | None = None) -> None:
        """rmsnorm of each row of x [nb, n]."""
        nb, n = x.shape
        self.lib.call(
            "q3t_batched_rmsnorm", x.data_ptr(), weight.data_ptr(), out.data_ptr(), n, nb, eps, _stream(stream)
        )

    def batched_rows_bf16(
        self, x: Tensor, out: Tensor, *, norm_w: Tensor | None = None, eps: float = 0.0, stream: int | None = None
    ) -> None:
        """Each row of x [rows, n] (float32) into out [rows, n] as bf16, RMS-normalised by norm_w when given."""
        rows, n = x.shape
        self.lib.call(
            "q3t_batched_rows_bf16", x.data_ptr(), _ptr(norm_w), eps, out.data_ptr(), n, rows, _stream(stream)
        )

    def batched_swiglu(self, gate_up: Tensor, out: Tensor, out_bf16: Tensor, *, stream: int | None = None) -> None:
        """silu(gate) * up of each row of gate_up [rows, 2 n] (interleaved) into out [rows, n] and out_bf16."""
        rows, n = out.shape
        self.lib.call(
            "q3t_batched_swiglu", gate_up.data_ptr(), out.data_ptr(), out_bf16.data_ptr(), n, rows, _stream(stream)
        )

    def batched_store_codes(
        self, codes: Tensor, history: Tensor, *, slot: Tensor, step: Tensor, stream: int | None = None
    ) -> None:
        """history [slots, max_frames, n][slot[r], step[slot[r]]] = codes [nb, n][r], inside the history only."""
        nb, n = codes.shape
        self.lib.call(
            "q3t_batched_store_codes",
            codes.data_ptr(),
            n,
            nb,
            slot.data_ptr(),
            step.data_ptr(),
            history.data_ptr(),
            history.shape[1],
            _stream(stream),
        )

    def batched_advance(
        self, slot: Tensor, *, pos: Tensor | None, step: Tensor | None, stream: int | None = None
    ) -> None:
        """pos[s] += 1 and step[s] += 1 for each row's slot s = slot[r] (either may be None)."""
        self.lib.call("q3t_batched_advance", slot.data_ptr(), slot.numel(), _ptr(pos), _ptr(step), _stream(stream))
