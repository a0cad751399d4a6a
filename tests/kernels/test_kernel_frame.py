"""The kernel backend's launch list (backends/kernels/frame.py) on the CPU: every q3t entry point is
replaced by a torch version of what kernels/include/q3t.h says it computes, shapes checked at each
call, and the frame's launches must then give the torch backend's greedy codes for 40 frames, with
(tiny) and without (tiny-0.6b) the Talker -> CodePredictor projection, with the matrices as they
load and quantized to int8 (model/quant.py: the launch list must hand every GEMV its row scales), and
under teacher forcing the same logits. What this cannot see, the kernels themselves, tests/kernels/test_kernels_gpu.py checks on a GPU."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import Tensor

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.batched import Admission, BatchedDecoder
from wyoming_qwen3tts.backends.kernels.frame import NUM_GROUPS, FrameState, launch_frame
from wyoming_qwen3tts.backends.kernels.ops import ADD, STORE, SWIGLU, Matrix
from wyoming_qwen3tts.backends.kernels.prefill import PrefillGraphs
from wyoming_qwen3tts.backends.kernels.weights import ModelWeights
from wyoming_qwen3tts.backends.torch_backend import TorchBackend
from wyoming_qwen3tts.model.checkpoint import load_checkpoint
from wyoming_qwen3tts.model.layers import rms_norm
from wyoming_qwen3tts.model.prompt import build_prompt
from wyoming_qwen3tts.model.quant import dequantize_rows, quantize_model
from wyoming_qwen3tts.model.talker import Qwen3TTSModel, apply_rope
from wyoming_qwen3tts.request import SamplingParams

FRAMES = 40
GREEDY = replace(SamplingParams.greedy(), suppress_eos=True)


class TorchOps:
    """ops.Ops' methods in torch, on whatever device the tensors are."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def gemv(
        self,
        w: Matrix,
        x: Tensor,
        y: Tensor,
        *,
        mode: int = STORE,
        norm_w: Tensor | None = None,
        eps: float = 0.0,
        bias: Tensor | None = None,
        stream: int | None = None,
    ) -> None:
        self.calls["gemv"] += 1
        self._gemv(w, x[None], y.view(1, -1), mode, norm_w, eps, bias)

    def gemv_batch(
        self,
        w: Matrix,
        x: Tensor,
        y: Tensor,
        *,
        mode: int = STORE,
        norm_w: Tensor | None = None,
        eps: float = 0.0,
        bias: Tensor | None = None,
        stream: int | None = None,
    ) -> None:
        self.calls["gemv_batch"] += 1
        assert x.ndim == 2 and y.shape[0] == x.shape[0]
        self._gemv(w, x, y, mode, norm_w, eps, bias)

    @staticmethod
    def _gemv(
        w: Matrix, x: Tensor, y: Tensor, mode: int, norm_w: Tensor | None, eps: float, bias: Tensor | None
    ) -> None:
        n, k = w.shape
        assert x.shape[1] == k and y.shape[1] == (n // 2 if mode == SWIGLU else n), (w.shape, x.shape, y.shape)
        assert x.dtype == y.dtype == torch.float32 and (bias is None or mode == STORE)
        assert isinstance(w, Matrix) and (w.scale is not None) == (w.dtype == torch.int8)
        dense = dequantize_rows(w.data, w.scale) if w.scale is not None else w.data.float()
        xn = rms_norm(x, norm_w, eps) if norm_w is not None else x
        r = xn @ dense.t()
        if mode == SWIGLU:
            y.copy_(torch.nn.functional.silu(r[:, 0::2]) * r[:, 1::2])
        elif mode == ADD:
            y.add_(r)
        else:
            y.copy_(r + bias if bias is not None else r)

    def rmsnorm(self, x: Tensor, weight: Tensor, out: Tensor, *, eps: float, stream: int | None = None) -> None:
        self.calls["rmsnorm"] += 1
        out.copy_(rms_norm(x, weight, eps))

    def _attend(
        self,
        qkv: Tensor,
        qn: Tensor,
        kn: Tensor,
        cos: Tensor,
        sin: Tensor,
        kc: Tensor,
        vc: Tensor,
        out: Tensor,
        eps: float,
        scale: float,
        pos: int,
    ) -> None:
        max_seq, hkv, d = kc.shape
        hq = out.numel() // d
        assert qkv.numel() == (hq + 2 * hkv) * d and cos.shape == (max_seq, d) and qn.numel() == kn.numel() == d
        assert 0 <= pos < max_seq
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d])
        c, s = cos[pos : pos + 1], sin[pos : pos + 1]
        q = apply_rope(rms_norm(q.view(1, hq, d), qn, eps), c, s)[0]
        kc[pos] = apply_rope(rms_norm(k.view(1, hkv, d), kn, eps), c, s)[0].to(kc.dtype)
        vc[pos] = v.view(hkv, d).to(vc.dtype)
        keys = kc[: pos + 1].float().repeat_interleave(hq // hkv, dim=1)
        values = vc[: pos + 1].float().repeat_interleave(hq // hkv, dim=1)
        probs = torch.softmax(torch.einsum("hd,lhd->hl", q, keys) * scale, dim=-1)
        out.copy_(torch.einsum("hl,lhd->hd", probs, values).reshape(out.shape))

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
        self.calls["rope_attention_split"] += 1
        assert (splits > 1) == (scratch is not None)
        at = (int(pos[0]) if pos is not None else 0) + pos_add
        self._attend(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, out, eps, scale, at)

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
        self.calls["rope_attention"] += 1
        at = (int(pos[0]) if pos is not None else 0) + pos_add
        self._attend(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, out, eps, scale, at)

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
        self.calls["rope_attention_first"] += 1
        assert out.shape[0] == qkv.shape[0]
        for p in range(qkv.shape[0]):
            self._attend(qkv[p], q_norm, k_norm, cos, sin, k_cache, v_cache, out[p], eps, scale, p)

    def embed_row(self, table: Tensor, token: Tensor, out: Tensor, *, stream: int | None = None) -> None:
        self.calls["embed_row"] += 1
        assert token.numel() == 1 and out.shape == (table.shape[1],)
        out.copy_(table[int(token[0])].float())

    def embed_sum(
        self,
        tables,
        table_ptrs: Tensor,
        codes: Tensor,
        trailing: Tensor,
        pad: Tensor,
        step: Tensor,
        out: Tensor,
        *,
        stream: int | None = None,
    ) -> None:
        self.calls["embed_sum"] += 1
        assert table_ptrs.tolist() == [t.data_ptr() for t in tables] and codes.numel() == len(tables)
        row = int(step[0])
        total = sum(t[int(c)].float() for t, c in zip(tables, codes))
        out.copy_(total + (trailing[row] if row < trailing.shape[0] else pad))

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
        self.calls["sample"] += 1
        assert not do_sample, "greedy only here"
        at = int(step[0]) if step is not None else 0
        code = self._greedy(logits, seen, penalty, eos, min_new_tokens, at, suppress)
        out_code.fill_(code)
        if seen is not None:
            seen[code] = 1
        if row_table is not None:
            assert row_out is not None and row_out.shape == (row_table.shape[1],)
            row_out.copy_(row_table[code].float())

    @staticmethod
    def _greedy(
        logits: Tensor,
        seen: Tensor | None,
        penalty: float,
        eos: int,
        min_new_tokens: int,
        step: int,
        suppress: tuple[int, int],
    ) -> int:
        x = logits.clone()
        if seen is not None and penalty != 1.0:
            ids = seen.nonzero().flatten()
            x[ids] = torch.where(x[ids] < 0, x[ids] * penalty, x[ids] / penalty)
        if eos >= 0 and step < min_new_tokens:
            x[eos] = float("-inf")
        keep = x[eos].clone() if 0 <= eos < x.numel() else None
        x[suppress[0] : suppress[1]] = float("-inf")
        if keep is not None:
            x[eos] = keep
        return int(torch.argmax(x))

    def cp_passes(
        self,
        layers,
        heads,
        inputs,
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
        stream: int | None = None,
    ) -> None:
        """What q3t.h says q3t_cp_passes computes, position by position (greedy, no slot)."""
        self.calls["cp_passes"] += 1
        assert not do_sample and slot is None and params is None and sync.tolist() == [0, 0]
        assert len(heads) == len(inputs) == 15 and 1 <= first <= last <= 15 and all(len(L) == 10 for L in layers)
        for j in range(first, last + 1):
            for in_norm, w_qkv, qn, kn, w_o, post_norm, w_gu, w_down, kc, vc in layers:
                self._gemv(Matrix(w_qkv), x[None], qkv[None], STORE, in_norm, eps, None)
                self._attend(qkv, qn, kn, cos, sin, kc, vc, attn, eps, scale, j)
                self._gemv(Matrix(w_o), attn[None], x[None], ADD, None, 0.0, None)
                self._gemv(Matrix(w_gu), x[None], mlp[None], SWIGLU, post_norm, eps, None)
                self._gemv(Matrix(w_down), mlp[None], x[None], ADD, None, 0.0, None)
            self._gemv(Matrix(heads[j - 1]), x[None], logits[None], STORE, final_norm, eps, None)
            code = self._greedy(logits, None, 1.0, -1, 0, 0, (0, 0))
            codes[j] = code
            if j < last:
                x.copy_(inputs[j][code].float())

    def store_row(self, src: Tensor, dst: Tensor, row: Tensor, *, stream: int | None = None) -> None:
        self.calls["store_row"] += 1
        r = int(row[0])
        if 0 <= r < dst.shape[0]:
            dst[r] = src

    def add_i32(self, counters: Tensor, delta: int, *, stream: int | None = None) -> None:
        self.calls["add_i32"] += 1
        counters.add_(delta)

    # -- the batched entry points a lone step uses (q3t.h: row r works on slot slot[r]'s state) --
    def use_pdl(self, want: bool) -> bool:
        return False

    def batched_gemv_scratch_floats(self, matrices) -> int:
        return 0

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
        self.calls["batched_sample"] += 1
        nb, v = logits.shape
        records = params.numpy().view(library.SAMPLE_PARAMS_DTYPE)
        out = out_codes.as_strided((nb,), (out_stride,), out_codes.storage_offset())  # out_codes[r * out_stride]
        for r in range(nb):
            s = int(slot[r])
            if s < 0:
                continue
            rec = records[s]
            assert not rec["flags"] & library.SAMPLE_DO_SAMPLE, "greedy only here"
            seen_s = seen[s] if seen is not None else None
            code = self._greedy(
                logits[r],
                seen_s,
                float(rec["penalty"]),
                int(rec["eos"]),
                int(rec["min_new_tokens"]),
                int(step[s]),
                suppress,
            )
            out[r] = code
            if seen_s is not None:
                seen_s[code] = 1
            if row_table is not None:
                assert row_out is not None
                h = row_table.shape[1]
                row_out.view(-1)[r * row_stride : r * row_stride + h] = row_table[code].float()

    def batched_store_codes(
        self, codes: Tensor, history: Tensor, *, slot: Tensor, step: Tensor, stream: int | None = None
    ) -> None:
        self.calls["batched_store_codes"] += 1
        for r, s in enumerate(slot.tolist()):
            if s >= 0 and 0 <= int(step[s]) < history.shape[1]:
                history[s, int(step[s])] = codes[r]

    def batched_embed_sum(
        self,
        tables,
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
        self.calls["batched_embed_sum"] += 1
        assert table_ptrs.tolist() == [t.data_ptr() for t in tables] and codes.shape[1] == len(tables)
        for r, s in enumerate(slot.tolist()):
            if s < 0:
                out[r] = 0
                continue
            at = int(step[s])
            text = trailing[s, at] if at < int(n_trailing[s]) else pad[s]
            out[r] = sum(t[int(c)].float() for t, c in zip(tables, codes[r])) + text

    def batched_advance(
        self, slot: Tensor, *, pos: Tensor | None, step: Tensor | None, stream: int | None = None
    ) -> None:
        self.calls["batched_advance"] += 1
        for s in slot.tolist():
            if s >= 0:
                for counters in (pos, step):
                    if counters is not None:
                        counters[s] += 1


def _model(path) -> Qwen3TTSModel:
    ck = load_checkpoint(path, dtype=torch.float32, device="cpu")
    model = Qwen3TTSModel.from_tensors(ck.config, ck.tensors, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        model.talker.codec_head.weight[model.cfg.talker.codec_eos_token_id].zero_()  # no EOS: all frames compared
    return model


def _prompt(model: Qwen3TTSModel):
    ids = [151644, 77091, 198, *range(1000, 1012), 151645, 198, 151644, 77091, 198]
    return build_prompt(model, ids, "ryan", "english")


def _prefilled(model: Qwen3TTSModel, prompt) -> FrameState:
    state = FrameState(model.cfg, model.dtype, model.device, capacity=prompt.length + FRAMES + 1, attn_splits=4)
    with torch.inference_mode():
        PrefillGraphs(model.talker.model, state.hn, model.dtype, enabled=False).prefill(prompt.embeds, state.cache)
        state.load_prompt(prompt)
    return state


@pytest.mark.parametrize("matrices_as", ["float32", "int8"])
@pytest.mark.parametrize("size", ["tiny", "tiny-0.6b"])
def test_launch_list_gives_the_torch_backends_greedy_codes(tiny_checkpoint, tiny_checkpoint_06b, size, matrices_as):
    model = _model(tiny_checkpoint if size == "tiny" else tiny_checkpoint_06b)
    if matrices_as == "int8":  # both sides read the same integers: the torch backend through QuantLinear
        assert quantize_model(model).modules > 0
    prompt = _prompt(model)
    want = TorchBackend(model).start(prompt, GREEDY, 0, FRAMES).next_frames(FRAMES)
    weights, state, ops = ModelWeights.from_model(model), _prefilled(model, prompt), TorchOps()
    stacks = (*weights.talker.layers, *weights.code_predictor.layers)
    matrices = [
        *(m for L in stacks for m in (L.qkv, L.o, L.gate_up, L.down)),
        weights.codec_head,
        *weights.lm_heads,
        *([weights.proj_w] if weights.proj_w is not None else []),
    ]
    assert {m.dtype for m in matrices} == {torch.int8 if matrices_as == "int8" else torch.float32}
    with torch.inference_mode():
        for _ in range(FRAMES):
            launch_frame(ops, weights, state, GREEDY, stream=0)  # type: ignore[arg-type]
    got = state.history[:FRAMES].numpy()
    assert want.shape == (FRAMES, NUM_GROUPS)
    np.testing.assert_array_equal(got, want)
    assert state.state.tolist() == [prompt.length + FRAMES, FRAMES]
    # Per frame: code 0 (2), the CodePredictor (positions 0 and 1 together, then one per code), the Talker.
    layers, cp_layers = model.cfg.talker.num_hidden_layers, model.cfg.code_predictor.num_hidden_layers
    projected = weights.proj_w is not None
    per_frame = {
        "gemv": 1 + int(projected) + 4 * cp_layers * 14 + 15 + 4 * layers,
        "gemv_batch": 4 * cp_layers,
        "rope_attention_first": cp_layers,
        "rope_attention": 14 * cp_layers,
        "rope_attention_split": layers,
        "sample": 16,
        "store_row": 1,
        "embed_sum": 1,
        "rmsnorm": 1,
        "add_i32": 1,
    }
    assert dict(ops.calls) == {name: n * FRAMES for name, n in per_frame.items()}


@pytest.mark.parametrize("size", ["tiny", "tiny-0.6b"])
def test_persistent_code_predictor_launch_gives_the_same_greedy_codes(tiny_checkpoint, tiny_checkpoint_06b, size):
    """With cp_persistent, positions 2..15 go to one q3t_cp_passes call with the buffers, tables and heads
    its contract names (position first's row in x, head j and table j at index j - 1): the same codes."""
    model = _model(tiny_checkpoint if size == "tiny" else tiny_checkpoint_06b)
    prompt = _prompt(model)
    want = TorchBackend(model).start(prompt, GREEDY, 0, FRAMES).next_frames(FRAMES)
    weights, state, ops = ModelWeights.from_model(model), _prefilled(model, prompt), TorchOps()
    with torch.inference_mode():
        for _ in range(FRAMES):
            launch_frame(ops, weights, state, GREEDY, stream=0, cp_persistent=True)  # type: ignore[arg-type]
    np.testing.assert_array_equal(state.history[:FRAMES].numpy(), want)
    cp_layers = model.cfg.code_predictor.num_hidden_layers
    assert ops.calls["cp_passes"] == FRAMES
    assert ops.calls["rope_attention"] == 0 and ops.calls["rope_attention_first"] == cp_layers * FRAMES
    assert ops.calls["sample"] == 2 * FRAMES  # code 0 and code 1; codes 2..15 are drawn inside the launch


@pytest.mark.parametrize("size", ["tiny", "tiny-0.6b"])
def test_teacher_forced_frames_write_each_row_after_the_hook(tiny_checkpoint, tiny_checkpoint_06b, size):
    """With a hook (teacher forcing) the draws write no rows; q3t_embed_row writes each position's row
    from the code the hook forced, so forcing the greedy codes gives back the same frames and logits."""
    model = _model(tiny_checkpoint if size == "tiny" else tiny_checkpoint_06b)
    prompt = _prompt(model)
    weights = ModelWeights.from_model(model)
    plain, forced = _prefilled(model, prompt), _prefilled(model, prompt)
    ops = TorchOps()
    frames = 6
    with torch.inference_mode():
        for f in range(frames):
            logits: list[Tensor] = []
            launch_frame(ops, weights, plain, GREEDY, stream=0, hook=lambda j, x: logits.append(x.clone()))  # type: ignore[arg-type]
            codes = plain.history[f].clone()
            forced_logits: list[Tensor] = []

            def hook(j: int, x: Tensor) -> None:
                forced_logits.append(x.clone())
                forced.codes[j] = codes[j]

            launch_frame(ops, weights, forced, GREEDY, stream=0, hook=hook)  # type: ignore[arg-type]
            assert len(logits) == len(forced_logits) == NUM_GROUPS
            assert all(torch.equal(a, b) for a, b in zip(logits, forced_logits))
    assert ops.calls["embed_row"] == 2 * frames * (NUM_GROUPS - 1)
    assert torch.equal(plain.history[:frames], forced.history[:frames])
    # And the hook-free launch list (rows written by the draws) decodes the same frames.
    free = _prefilled(model, prompt)
    with torch.inference_mode():
        for _ in range(frames):
            launch_frame(TorchOps(), weights, free, GREEDY, stream=0)  # type: ignore[arg-type]
    assert torch.equal(free.history[:frames], plain.history[:frames])


@pytest.mark.parametrize("size", ["tiny", "tiny-0.6b"])
def test_a_lone_slot_steps_on_the_batch1_frame_over_its_own_state(tiny_checkpoint, tiny_checkpoint_06b, size):
    """lone.py: the one busy slot of a batched decoder decodes the torch backend's greedy codes through the
    batch-1 frame's launch list over that slot's cache, counters, penalty set and history (the draw, store,
    embedding sum and advance being the batched entry points at one row), and leaves the other slots alone."""
    model = _model(tiny_checkpoint if size == "tiny" else tiny_checkpoint_06b)
    prompt = _prompt(model)
    want = TorchBackend(model).start(prompt, GREEDY, 0, FRAMES).next_frames(FRAMES)
    ops = TorchOps()
    dec = BatchedDecoder(
        model,
        ops,
        ModelWeights.from_model(model),
        slots=4,
        max_seq=prompt.length + FRAMES + 1,  # type: ignore[arg-type]
        max_trailing=8,
        graphs=False,
        lone_splits=4,
    )
    slot = 2
    with torch.inference_mode():
        dec.admit_all([Admission(slot, prompt, GREEDY, 0)])
        assert dec.lone_slot() == slot and dec.nb == 4
        for _ in range(FRAMES):
            dec.step()
    assert dec.lone_steps == FRAMES
    np.testing.assert_array_equal(dec.history[slot, :FRAMES].numpy(), want)
    assert (dec.history[[0, 1, 3]] == -1).all() and (dec.history[slot, FRAMES:] == -1).all()
    assert dec.pos.tolist() == [0, 0, prompt.length + FRAMES, 0] and dec.step_index.tolist() == [0, 0, FRAMES, 0]
    assert dec.seen[slot].sum() > 0 and dec.seen[[0, 1, 3]].sum() == 0
    # The batch-1 frame's launches (positions 0 and 1 of the CodePredictor together), the batched ones at one row.
    layers, cp_layers = model.cfg.talker.num_hidden_layers, model.cfg.code_predictor.num_hidden_layers
    per_frame = {
        "gemv": 1 + int(dec.w.proj_w is not None) + 4 * cp_layers * 14 + 15 + 4 * layers,
        "gemv_batch": 4 * cp_layers,
        "rope_attention_first": cp_layers,
        "rope_attention": 14 * cp_layers,
        "rope_attention_split": layers,
        "batched_sample": 16,
        "batched_store_codes": 1,
        "batched_embed_sum": 1,
        "rmsnorm": 1,
        "batched_advance": 1,
    }
    assert dict(ops.calls) == {name: n * FRAMES for name, n in per_frame.items()}
    # A second busy slot: no lone slot, the next step is the batched one.
    with torch.inference_mode():
        dec.admit_all([Admission(0, prompt, GREEDY, 1)])
    assert dec.lone_slot() is None
    dec.release(0)
    assert dec.lone_slot() == slot
    off = BatchedDecoder(model, ops, dec.w, slots=4, max_seq=prompt.length + 2, graphs=False, invariant=True)  # type: ignore[arg-type]
    with torch.inference_mode():
        off.admit_all([Admission(1, prompt, GREEDY, 0)])
    assert off.lone is None and off.lone_slot() is None


def test_bucket_for() -> None:
    from wyoming_qwen3tts.backends.kernels.batched import MAX_SLOTS, bucket_for

    assert [bucket_for(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64)] == [1, 2, 4, 4, 8, 8, 16, 16, 32, 64, 64]
    with pytest.raises(ValueError):
        bucket_for(MAX_SLOTS + 1)


def test_matrix_carries_row_scales_for_int8_only() -> None:
    """ops.Matrix: int8 data needs float32 scales [N], other dtypes take none; a bare int8 tensor is refused
    (it would reach the kernels without its scales)."""
    from wyoming_qwen3tts.backends.kernels.ops import _matrix

    q, scale = torch.zeros(4, 16, dtype=torch.int8), torch.ones(4)
    m = Matrix(q, scale)
    assert m.shape == (4, 16) and m.dtype == torch.int8
    for bad in (
        lambda: Matrix(q),
        lambda: Matrix(q.float(), scale),
        lambda: Matrix(q, torch.ones(3)),
        lambda: Matrix(q, scale.double()),
    ):
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(ValueError, match="row scales"):
        _matrix(q)
    assert _matrix(m)[2] == scale.data_ptr() and _matrix(q.float())[2] is None
