"""Bucketed prefill (Transformer.prefill_bucketed) on the CPU, float32: the prompt right-padded with
zero rows to a bucket length gives the plain prefill's last hidden state and cache entries, and the
same greedy codes after it.

Not bitwise: with pads the matmuls run with M = bucket rows instead of L (and the attention's inner
sums over bucket keys instead of L, the extra ones masked to exact zeros); BLAS picks its blocking
and summation order by shape, so the last bits may differ. Hence allclose at rtol 1e-5 / atol 4e-6
(measured worst case on the development machine: 84 % of rtol 1e-5 / atol 1e-6; other CPUs block differently).

The captured-graph path that uses this scheme (backends/kernels/prefill.py) is tested on a GPU in
tests/kernels/test_prefill_gpu.py; its bucket policy and bookkeeping are checked here.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.backends.kernels.options import KernelOptions
from wyoming_qwen3tts.backends.kernels.prefill import PrefillGraphs
from wyoming_qwen3tts.backends.torch_backend import TorchBackend
from wyoming_qwen3tts.engine import Engine, EngineOptions, SamplingParams, SynthesisRequest
from wyoming_qwen3tts.model.talker import PREFILL_BUCKETS, prefill_bucket

RTOL, ATOL = 1e-5, 4e-6


@pytest.fixture(scope="module")
def engine(tiny_checkpoint) -> Engine:
    return Engine.from_pretrained(str(tiny_checkpoint), EngineOptions(device="cpu", dtype="float32", backend="torch"))


def _round_up(n: int, step: int = 16) -> int:
    return -(-n // step) * step


def _inputs(engine: Engine, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    hidden = engine.model.cfg.talker.hidden_size
    return torch.randn(n, hidden, generator=g) * 0.05  # the scale of real prompt embeddings


# L, bucket: padded (L < bucket) and exact multiples (L == bucket, no pad row), small and larger.
CASES = [(1, 16), (5, 16), (15, 16), (16, 16), (16, 32), (17, 32), (31, 32), (32, 32), (33, 48), (48, 48), (47, 64)]


@pytest.mark.parametrize("length,bucket", CASES)
@pytest.mark.parametrize("start", [0, 7])
def test_bucketed_prefill_matches_plain(engine, length, bucket, start):
    """Same last hidden state and same first start+L cache entries; length set to start+L.
    start > 0: a block after earlier positions (the mask's offset), not only a fresh prompt."""
    stack = engine.model.talker.model
    x = _inputs(engine, length, seed=length)
    head = _inputs(engine, start, seed=1000) if start else None
    plain = engine.model.new_talker_cache(128)
    padded = engine.model.new_talker_cache(128)
    # Poison the bucketed run's cache: a read of any position it has not written gives NaN.
    padded.data.fill_(float("nan"))
    with torch.inference_mode():
        if head is not None:
            stack(head, plain)
            stack(head, padded)
        want = stack(x, plain)[-1:]
        got = stack.prefill_bucketed(x, padded, bucket)
    end = start + length
    assert padded.length == plain.length == end
    assert got.shape == want.shape == (1, x.shape[1])
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(padded.data[:, :, :end], plain.data[:, :, :end], rtol=RTOL, atol=ATOL)
    # The pads' K/V sit past `length` (finite: zero inputs), the rest of the cache is untouched.
    assert torch.isfinite(padded.data[:, :, end : start + bucket]).all()
    assert torch.isnan(padded.data[:, :, start + bucket :]).all()


def test_bucketed_prefill_rejects_bad_buckets(engine):
    stack = engine.model.talker.model
    x = _inputs(engine, 20, seed=0)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="cannot hold"):
            stack.prefill_bucketed(x, engine.model.new_talker_cache(64), 16)
        with pytest.raises(RuntimeError, match="KV cache full"):
            stack.prefill_bucketed(x, engine.model.new_talker_cache(24), 32)


TEXTS = [
    "Hi.",
    "This is a sentence for the bucketed prefill test.",
    "A longer request: the quick brown fox jumps over the lazy dog while the kettle starts to sing in the kitchen.",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("how", ["round16", "no_pad", "cache_cap"])
def test_greedy_codes_after_bucketed_prefill(engine, text, how):
    """Greedy codes for 50 frames (EOS suppressed, so all 50 are compared) are identical whether the
    torch session's prompt was prefilled plainly or right-padded to a bucket."""
    frames = 50
    sampling = replace(SamplingParams.greedy(), suppress_eos=True)
    prompt = engine.prepare(SynthesisRequest(text=text, speaker="ryan", language="english", sampling=sampling))
    length = prompt.length
    backend = TorchBackend(engine.model)
    want = backend.start(prompt, sampling, 0, frames).next_frames(frames)

    session = backend.start(prompt, sampling, 0, frames)  # prefilled plainly; redo it bucketed
    cache = session.cache
    bucket = {"round16": _round_up(length), "no_pad": length, "cache_cap": cache.max_seq}[how]
    assert length <= bucket <= cache.max_seq
    cache.data.fill_(float("nan"))  # a read of a position nobody wrote would poison the codes
    cache.reset()
    with torch.inference_mode():
        session.hidden = engine.model.talker.model.prefill_bucketed(prompt.embeds, cache, bucket)
    assert cache.length == length
    got = session.next_frames(frames)
    assert want.shape == (frames, 16)
    np.testing.assert_array_equal(got, want)


def test_prefill_bucket_policy():
    assert PREFILL_BUCKETS[0] == 16 and PREFILL_BUCKETS[-1] == 512 and len(PREFILL_BUCKETS) == 20
    assert list(PREFILL_BUCKETS) == sorted(set(PREFILL_BUCKETS))
    assert all(b % 16 == 0 for b in PREFILL_BUCKETS)
    assert prefill_bucket(1, 2048) == 16
    assert prefill_bucket(16, 2048) == 16
    assert prefill_bucket(17, 2048) == 32
    assert prefill_bucket(30, 2048) == 32  # the bench's one-sentence prompt
    assert prefill_bucket(129, 2048) == 160
    assert prefill_bucket(512, 2048) == 512
    assert prefill_bucket(513, 4096) is None  # longer prompts run eagerly
    assert prefill_bucket(40, 40) is None  # a bucket past the cache runs eagerly
    assert prefill_bucket(40, 48) == 48
    for n in range(1, 513):
        b = prefill_bucket(n, 2048)
        assert b is not None and n <= b and b - n < (16 if n <= 128 else 32)


def _cpu_graphs(engine: Engine) -> PrefillGraphs:
    """The prefill graphs' bookkeeping without a GPU: a 'capture' that records its bucket and returns
    the body it would capture, run eagerly on replay."""
    hidden = engine.model.cfg.talker.hidden_size
    graphs = PrefillGraphs(engine.model.talker.model, torch.zeros(hidden), torch.float32)
    graphs.captured = []  # type: ignore[attr-defined]
    graphs.capture = lambda bucket, run: graphs.captured.append(bucket) or SimpleNamespace(replay=run)  # type: ignore[method-assign]
    return graphs


def test_graph_prefill_bookkeeping_on_cpu(engine):
    """What runs around the captured graph (static input, zero pads, the device index of the last
    row, one graph per bucket, re-capture after the cache is replaced), with the capture faked:
    the same hn and cache entries as the eager prefill. The capture itself is GPU-only
    (tests/kernels/test_prefill_gpu.py)."""
    g = _cpu_graphs(engine)
    cache = engine.model.new_talker_cache(128)
    stack = engine.model.talker.model
    for i, (n, bucket) in enumerate([(13, 16), (5, 16), (16, 16), (20, 32), (13, 16)]):  # a bucket, another, back
        x = _inputs(engine, n, seed=100 + i)
        plain = engine.model.new_talker_cache(128)
        cache.data.fill_(float("nan"))
        with torch.inference_mode():
            want = stack(x, plain)[-1]
            g.prefill(x, cache)
        assert cache.length == n
        torch.testing.assert_close(g.hn, want, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(cache.data[:, :, :n], plain.data[:, :, :n], rtol=RTOL, atol=ATOL)
        assert torch.isnan(cache.data[:, :, bucket:]).all()  # nothing past the bucket written
    assert g.captured == [16, 32] and set(g.graphs) == {16, 32}
    grown = engine.model.new_talker_cache(128)  # what the backend does when a request needs more room
    with torch.inference_mode():
        g.prefill(_inputs(engine, 9, seed=7), grown)
    assert g.captured == [16, 32, 16] and set(g.graphs) == {16}


def test_graph_prefill_is_the_default_and_can_be_turned_off():
    assert KernelOptions().graph_prefill is True
    assert KernelOptions.from_env({}).graph_prefill is True
    assert KernelOptions.from_env({"Q3T_GRAPH_PREFILL": "1"}).graph_prefill is True
    assert KernelOptions.from_env({"Q3T_GRAPH_PREFILL": "0"}).graph_prefill is False


def test_kernel_options_from_the_environment():
    assert KernelOptions.from_env({}) == KernelOptions(pdl=True, attn_splits=32, graph_prefill=True)
    assert KernelOptions.from_env({"Q3T_PDL": "0", "Q3T_ATTN_SPLITS": "8"}) == KernelOptions(pdl=False, attn_splits=8)
    assert KernelOptions.from_env({}).gemv_clusters is True
    assert KernelOptions.from_env({"Q3T_GEMV_CLUSTER": "0"}) == KernelOptions(gemv_clusters=False)
    assert KernelOptions.from_env({}).gemv_groups is False
    assert KernelOptions.from_env({"Q3T_GEMV_GROUPS": "1"}) == KernelOptions(gemv_groups=True)
    assert KernelOptions.from_env({}).first_audio_hold is True
    assert KernelOptions.from_env({"Q3T_FIRST_AUDIO_HOLD": "0"}) == KernelOptions(first_audio_hold=False)
    assert KernelOptions.from_env({}).fused_prefill is True
    assert KernelOptions.from_env({"Q3T_FUSED_PREFILL": "0"}) == KernelOptions(fused_prefill=False)
    with pytest.raises(ValueError, match="1..1024"):
        KernelOptions.from_env({"Q3T_ATTN_SPLITS": "0"})


@pytest.mark.parametrize("length,bucket", [(1, 16), (5, 16), (16, 16), (17, 32), (47, 64)])
@pytest.mark.parametrize("start", [0, 7])
def test_fused_ops_prefill_matches_the_reference_ops(engine, length, bucket, start):
    """Transformer.use_fused_ops (F.rms_norm, and from position 0 F.scaled_dot_product_attention): the same last
    hidden state and cache entries as the reference's ops, float32, within the tolerance of a different summation
    order; a prefill after earlier positions (start 7) keeps the reference attention and fuses only the norms.
    Several prompts into slots (prefill_rows) likewise."""
    stack = engine.model.talker.model
    x = _inputs(engine, length, seed=length)
    head = _inputs(engine, start, seed=1000) if start else None
    caches = [engine.model.new_talker_cache(128) for _ in range(2)]
    out = []
    try:
        for fused, cache in zip((False, True), caches):
            stack.use_fused_ops(fused)
            with torch.inference_mode():
                if head is not None:
                    stack(head, cache)
                out.append(stack.prefill_bucketed(x, cache, bucket))
    finally:
        stack.use_fused_ops(False)
    end = start + length
    torch.testing.assert_close(out[1], out[0], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(caches[1].data[:, :, :end], caches[0].data[:, :, :end], rtol=RTOL, atol=ATOL)
    if start:
        return
    cfg = engine.model.cfg.talker
    prompts = [x, _inputs(engine, max(length // 2, 1), seed=7)]
    slots = torch.tensor([2, 0])
    rows = []
    try:
        for fused in (False, True):
            stack.use_fused_ops(fused)
            cache = torch.zeros(3, cfg.num_hidden_layers, 2, 128, cfg.num_key_value_heads, cfg.head_dim)
            with torch.inference_mode():
                rows.append((stack.prefill_rows(prompts, cache, slots), cache))
    finally:
        stack.use_fused_ops(False)
    torch.testing.assert_close(rows[1][0], rows[0][0], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(rows[1][1], rows[0][1], rtol=RTOL, atol=ATOL)
    assert all(not m.fused for m in stack.modules() if hasattr(m, "fused"))


def test_the_torch_backend_keeps_the_reference_ops(engine):
    """A torch backend made after a kernel backend fused the prefill's ops (one that then failed to load) runs the
    reference's ops again."""
    stack = engine.model.talker.model
    stack.use_fused_ops(True)
    try:
        assert all(m.fused for m in stack.modules() if hasattr(m, "fused"))
        TorchBackend(engine.model)
        assert not any(m.fused for m in stack.modules() if hasattr(m, "fused"))
    finally:
        stack.use_fused_ops(False)


def test_warm_up_captures_each_bucket_once_on_cpu(engine):
    g = _cpu_graphs(engine)
    cache = engine.model.new_talker_cache(128)
    with torch.inference_mode():
        assert g.warm_up(cache, max_positions=48) == 3
        assert g.captured == [16, 32, 48]
        assert g.warm_up(cache, max_positions=48) == 0 and g.captured == [16, 32, 48]
        assert g.warm_up(cache, max_positions=80) == 2 and g.captured == [16, 32, 48, 64, 80]
        off = _cpu_graphs(engine)
        off.enabled = False
        assert off.warm_up(cache) == 0 and off.captured == []


def test_a_failed_capture_falls_back_to_the_eager_prefill(engine, caplog):
    """A runtime that cannot capture the prefill (some ROCm/driver versions): one warning, then every
    prefill runs eagerly (as with Q3T_GRAPH_PREFILL=0); an out-of-memory error still propagates."""
    g = _cpu_graphs(engine)
    cache = engine.model.new_talker_cache(128)

    def broken(bucket: int, run):
        raise RuntimeError("operation not permitted when stream is capturing")

    g.capture = broken
    x = _inputs(engine, 9, seed=3)
    with caplog.at_level("WARNING"), torch.inference_mode():
        g.prefill(x, cache)
        want = engine.model.talker.model(x, engine.model.new_talker_cache(128))[-1]
    assert not g.enabled and not g.graphs
    assert "prefilling eagerly" in caplog.text
    assert cache.length == 9
    torch.testing.assert_close(g.hn, want, rtol=RTOL, atol=ATOL)  # the eager prefill ran instead
    assert g.warm_up(cache) == 0

    oom = _cpu_graphs(engine)

    def out_of_memory(bucket: int, run):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    oom.capture = out_of_memory
    with pytest.raises(torch.cuda.OutOfMemoryError), torch.inference_mode():
        oom.prefill(x, cache)
    assert oom.enabled
