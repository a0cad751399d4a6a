"""The kernel backend's captured prefill (backends/kernels/prefill.py; on by default) on a GPU, tiny checkpoint.

- float32 greedy codes equal the torch backend's for 100 frames, for prompts of several lengths:
  two different lengths in one bucket (the second replays the first one's graph), one in another
  bucket, the first again after it (graphs share a memory pool: any replay order must hold), a
  prompt past the largest bucket (eager fallback), and after the cache was re-allocated (graphs
  re-captured for the new cache);
- the graph writes the same last hidden state and KV entries as the eager prefill (allclose: its
  matmuls run with M = bucket rows, cuBLAS may pick other kernels);
- bf16 through the engine is reproducible from the capture's request to the replays';
- the engine's warm-up captures every bucket up to WARM_PREFILL_POSITIONS, and a request then
  replays one of those graphs (no capture) with the torch backend's codes;
- a timing print: prefill ms eager vs graph (tiny model: launch-bound, like the full-size one);
- with the prefix cache, the warm-up also captures the graphs of prefills after a prefix, and a voice's later
  requests (its prefix cached) replay them with the torch backend's codes, for two prefix lengths.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.backends.kernels.options import KernelOptions
from wyoming_qwen3tts.backends.kernels.prefill import WARM_PREFILL_POSITIONS
from wyoming_qwen3tts.engine import Engine, EngineOptions, SamplingParams, SynthesisRequest
from wyoming_qwen3tts.model.talker import PREFILL_BUCKETS, prefill_bucket

pytestmark = pytest.mark.gpu

FRAMES = 100
GREEDY = replace(SamplingParams.greedy(), suppress_eos=True)  # all FRAMES frames are compared
WORDS = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four"
).split()
TEXT = "The engine on the GPU speaks this sentence for the test, and then another one after it."


def _request(text: str, sampling: SamplingParams = GREEDY, **kw) -> SynthesisRequest:
    kw.setdefault("language", "english")
    return SynthesisRequest(text=text, speaker="ryan", sampling=sampling, **kw)


def _engine(path, backend: str, dtype: str = "float32", graph: bool = True, prefix_cache_mb: int = 0) -> Engine:
    options = EngineOptions(
        prefix_cache_mb=prefix_cache_mb,
        device="cuda",
        dtype=dtype,
        backend=backend,
        first_chunk_frames=2,
        chunk_frames=8,  # type: ignore[arg-type]
        kernels=KernelOptions(graph_prefill=graph),
        max_streams=1,
    )
    engine = Engine.from_pretrained(str(path), options)
    if backend == "kernels":
        if engine.info.backend != "kernels":
            pytest.fail(f"kernel backend did not load: {engine.info.backend_reason}")
        assert engine.backend.prefills.enabled is graph
    return engine


@pytest.fixture(scope="module")
def kern(tiny_checkpoint) -> Engine:
    return _engine(tiny_checkpoint, "kernels")


@pytest.fixture(scope="module")
def ref(tiny_checkpoint) -> Engine:
    return _engine(tiny_checkpoint, "torch")


def _texts_by_bucket(engine: Engine) -> tuple[str, str, str]:
    """Texts a, b whose prompts differ in length but share a bucket, and c in another bucket
    (chosen here, so the test holds whatever the tokenizer on the box makes of them)."""
    by_bucket: dict[int, dict[int, str]] = {}
    for k in range(1, len(WORDS) + 1):
        text = " ".join(WORDS[:k]) + "."
        n = engine.prepare(_request(text)).length
        by_bucket.setdefault(prefill_bucket(n, engine.backend.capacity), {}).setdefault(n, text)
    same = next(b for b, lengths in by_bucket.items() if b is not None and len(lengths) >= 2)
    other = next(b for b in by_bucket if b is not None and b != same)
    (a, b), c = list(by_bucket[same].values())[:2], next(iter(by_bucket[other].values()))
    return a, b, c


def _codes(engine: Engine, text: str, frames: int = FRAMES, max_frames: int | None = None) -> np.ndarray:
    prompt = engine.prepare(_request(text))
    return engine.backend.start(prompt, GREEDY, 0, max_frames or frames).next_frames(frames)


def test_graph_prefill_codes_match_torch(kern, ref):
    backend = kern.backend
    captures: list[int] = []
    capture = backend.prefills.capture

    def counting(bucket: int, run):  # type: ignore[no-untyped-def]
        captures.append(bucket)
        return capture(bucket, run)

    backend.prefills.capture = counting
    backend.prefills.graphs.clear()  # whatever tests ran before: count this test's captures
    try:
        a, b, c = _texts_by_bucket(kern)
        lengths = {t: kern.prepare(_request(t)).length for t in (a, b, c)}
        buckets = {t: prefill_bucket(n, backend.capacity) for t, n in lengths.items()}
        print(f"prompt lengths {lengths}, buckets {buckets}")
        first = {}
        for text in (a, b, c):
            first[text] = _codes(kern, text)
            want = _codes(ref, text)
            assert want.shape == (FRAMES, 16)
            np.testing.assert_array_equal(first[text], want, err_msg=f"prompt of {lengths[text]} positions")
        # a captured its bucket, b replayed it, c captured another one.
        assert captures == [buckets[a], buckets[c]]
        np.testing.assert_array_equal(_codes(kern, a), first[a])  # replay after another bucket's graph
        assert captures == [buckets[a], buckets[c]]
        assert set(backend.prefills.graphs) == {buckets[a], buckets[c]}
    finally:
        del backend.prefills.capture


def test_graph_prefill_long_prompt_runs_eagerly(kern, ref):
    long_text = " ".join(WORDS * 20) + "."  # ~3,600 characters (the limit is 5,000), > 512 positions
    assert kern.prepare(_request(long_text)).length > PREFILL_BUCKETS[-1]
    before = set(kern.backend.prefills.graphs)
    np.testing.assert_array_equal(_codes(kern, long_text, 20), _codes(ref, long_text, 20))
    assert set(kern.backend.prefills.graphs) == before


def test_graph_prefill_recaptures_after_cache_growth(tiny_checkpoint, ref):
    engine = _engine(tiny_checkpoint, "kernels")
    backend = engine.backend
    _codes(engine, TEXT, 4)
    old_cache, old_graphs = backend.state.cache, dict(backend.prefills.graphs)
    assert len(old_graphs) == 1
    grown = _codes(engine, TEXT, 20, max_frames=backend.capacity + 10)  # grow: a new, larger cache
    assert backend.state.cache is not old_cache
    ((bucket, graph),) = backend.prefills.graphs.items()
    assert bucket in old_graphs and graph is not old_graphs[bucket]  # captured again for the new cache
    np.testing.assert_array_equal(grown, _codes(ref, TEXT, 20))


def test_graph_prefill_matches_eager_prefill(kern):
    """Same hn and first-L cache entries as the eager torch prefill (float32, different M: allclose)."""
    backend = kern.backend
    prompt = kern.prepare(_request(TEXT))
    n = prompt.length
    out = {}
    for graph in (False, True):
        backend.prefills.enabled = graph
        try:
            backend.state.cache.data.fill_(float("nan"))
            backend.prefill(prompt, FRAMES)
            torch.cuda.synchronize()
            out[graph] = (
                backend.state.hn.clone(),
                backend.state.cache.data[:, :, :n].clone(),
                backend.state.cache.length,
            )
        finally:
            backend.prefills.enabled = True
    (h0, c0, n0), (h1, c1, n1) = out[False], out[True]
    assert n0 == n1 == n
    torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c1, c0, rtol=1e-5, atol=1e-5)


def test_graph_prefill_bf16_reproducible(tiny_checkpoint):
    engine = _engine(tiny_checkpoint, "kernels", dtype="bfloat16")
    request = _request(TEXT, replace(SamplingParams(), suppress_eos=True), max_frames=40, seed=11)
    first = engine.synthesize_all(request)  # captures the bucket's graph
    assert len(engine.backend.prefills.graphs) == 1
    for _ in range(2):  # replays
        again = engine.synthesize_all(request)
        assert np.array_equal(again[1], first[1]) and again[0] == first[0]
    assert first[1].shape == (40, 16)


def test_graph_prefill_engine_matches_torch_engine(kern, ref):
    request = _request(TEXT, max_frames=60, seed=3)
    pcm, codes = kern.synthesize_all(request)
    ref_pcm, ref_codes = ref.synthesize_all(request)
    np.testing.assert_array_equal(codes, ref_codes)
    a = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
    b = np.frombuffer(ref_pcm, dtype="<i2").astype(np.int32)
    assert a.shape == b.shape and np.abs(a - b).max() <= 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_prefill_timing(tiny_checkpoint, dtype, capsys):
    """Not an assertion on speed: prints prefill ms eager vs graph so the run's log shows the gain."""
    engine = _engine(tiny_checkpoint, "kernels", dtype=dtype)
    backend = engine.backend
    prompt = engine.prepare(_request(TEXT))
    times: dict[bool, list[float]] = {False: [], True: []}
    for graph in (False, True):
        backend.prefills.enabled = graph
        for i in range(23):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            backend.prefill(prompt, FRAMES)
            torch.cuda.synchronize()
            if i >= 3:  # the first ones load kernels / capture
                times[graph].append((time.perf_counter() - t0) * 1e3)
    eager, graph = statistics.median(times[False]), statistics.median(times[True])
    cfg = engine.model.cfg.talker
    with capsys.disabled():
        print(
            f"\n[prefill timing] tiny {dtype} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}), "
            f"{prompt.length} positions -> bucket {prefill_bucket(prompt.length, backend.capacity)}: "
            f"eager {eager:.2f} ms, graph {graph:.2f} ms (median of 20)"
        )
    assert eager > 0 and graph > 0


def test_warm_up_captures_the_common_buckets(tiny_checkpoint, ref):
    engine = _engine(tiny_checkpoint, "kernels")
    backend = engine.backend
    assert not backend.prefills.graphs
    engine.warm_up()
    want = {b for b in PREFILL_BUCKETS if b <= min(WARM_PREFILL_POSITIONS, backend.capacity)}
    assert set(backend.prefills.graphs) == want
    captured = dict(backend.prefills.graphs)
    got = _codes(engine, TEXT)  # its bucket was captured at warm-up: replayed, not captured again
    assert set(backend.prefills.graphs) == want
    assert all(backend.prefills.graphs[b] is g for b, g in captured.items())
    assert np.array_equal(got, _codes(ref, TEXT))


def test_prefix_cache_replays_the_graphs_after_a_prefix_with_the_torch_codes(tiny_checkpoint, ref):
    engine = _engine(tiny_checkpoint, "kernels", prefix_cache_mb=64)
    backend = engine.backend
    engine.warm_up()
    want = {b for b in PREFILL_BUCKETS if b <= min(WARM_PREFILL_POSITIONS, backend.capacity)}
    assert set(backend.prefills.after_graphs) == want
    cache = backend.prefills.prefixes
    assert cache is not None
    captured = dict(backend.prefills.after_graphs)
    # The warm-up's own request (another voice) may have met the cache: count from here.
    misses, hits = cache.misses, cache.hits
    texts = (TEXT, "A second sentence, for the same voice.", TEXT)
    for language in ("english", "auto"):  # two prefix lengths (with and without the language's position)
        for text in texts:
            prompt = engine.prepare(_request(text, language=language))
            got = backend.start(prompt, GREEDY, 0, FRAMES).next_frames(FRAMES)
            want_codes = ref.backend.start(ref.prepare(_request(text, language=language)), GREEDY, 0, FRAMES)
            np.testing.assert_array_equal(got, want_codes.next_frames(FRAMES), err_msg=f"{language}: {text}")
    assert (cache.misses - misses, cache.hits - hits) == (2, 4)  # one miss per prefix length, then hits
    assert all(backend.prefills.after_graphs[b] is g for b, g in captured.items())  # replayed, none captured
