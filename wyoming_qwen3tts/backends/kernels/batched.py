"""Many decode streams in one frame step: the frame of frame.py for up to 64 streams at once, each
weight matrix read once per step for every 16 of them (the q3t_batched_* kernels, q3t.h last section).

Each stream owns a slot: its Talker KV cache block, position, frame index, seed, sampling settings,
repetition-penalty set, trailing text and code history, all in device memory, so a stream joins
(admit_all: the prompts of all streams joining at one step boundary prefilled together, each into
its block, between steps) or leaves (release) without touching the others and without a new graph.
Row r of every per-row buffer (hidden states, codes, logits, the CodePredictor's short cache)
belongs to slot r; a step runs the first `nb` rows, nb a bucket (1, 2, 4, ..., 64) covering the
highest slot in use, and rows whose slot is free pad (slot -1: the kernels skip their writes to
per-slot state). One graph is captured per bucket at construction. While exactly one slot is busy,
its step is the batch-1 frame's kernels over that slot's state instead (lone.py: a lone stream at
the batch-1 frame's speed), one graph per slot.

The CodePredictor's positions 0 and 1 run together, as in the batch-1 frame, where their 2 x nb vectors fit
one batched GEMV (nb <= 8), else one after the other; every row's numbers depend only on its own inputs
(q3t.h's row independence), and with invariant=True (batch invariance) the positions always run one after
the other, so a stream then decodes the same codes alone and next to any batch-mates, bit for bit. With lone
steps on, a stream's sums may round differently with the kernels its step count of streams takes (the
batch-1 frame alone, positions paired up to 8 streams): float32 rounding, not its batch-mates' data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ...model.config import Qwen3TTSConfig
from ...model.layers import rope_tables
from ...model.prompt import Prompt
from ...model.talker import KVCache, Qwen3TTSModel
from ...request import SamplingParams
from . import library
from .frame import MIN_NEW_TOKENS, NO_EOS, NUM_GROUPS
from .gemm import BlasProducts, blas_supported
from .lone import LoneStep
from .ops import Matrix, Ops
from .prefill import WARM_PREFILL_POSITIONS, BatchedPrefillGraphs, PrefillGraphs
from .weights import ModelWeights, StackWeights

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_SLOTS = BUCKETS[-1]  # Q3T_BATCH_MAX
# Padded positions (streams x the longest prompt) one batched prefill runs at most: 16 one-sentence
# prompts (~30-150 positions) go in one forward; longer ones take more, since the attention scores
# grow with streams x positions^2 (16 prompts of 1,024 positions would hold 1 GiB of them).
PREFILL_POSITIONS = 4096
# At most this many streams joining at one step boundary are prefilled one by one through the one-stream
# backend's captured prefill graphs (a graph replay each, then their K/V copied into the slot); more go
# through one batched forward: a captured one (capture_prefills) where their count and lengths fit one,
# else eager. A lone arrival's eager prefill is ~1,700 launches issued from Python on the scheduler thread
# (~25 ms for the 1.7B) while its graph is a few ms of GPU time; 16 arrivals cost 16 replays of a few ms
# but one batched forward.
GRAPHED_ADMISSIONS = 4
# The row counts of the captured batched prefills: 5-8 arrivals replay the 8-row graph, 9-16 the 16-row one.
BATCHED_PREFILL_ROWS = (8, 16)
# Up to this many rows, the CodePredictor's positions 0 and 1 go through its layers together: 2 x 8 vectors
# are the most one batched GEMV launch takes (gemv_batched.cu: more go 16 at a time, so pairing more rows
# would save no weight read). Saves one of its 16 passes (H200, 1.7B: ~3 % of a step).
PAIRED_ROWS = 8
PAIRED = -1  # _layers' pos_add for positions 0 and 1 together


def attention_splits(slots: int) -> int:
    """Blocks per head of the Talker's split attention for a decoder of `slots` streams. Fixed per
    decoder, never per step: the split fixes the order of a row's sums (row independence). The
    batch-1 frame's 32 fill the GPU with 16 heads of one stream; at 16 streams that is 8,192 blocks
    of a few positions each, and on the H200 (context 200, 16 streams) 4 per head was the best of
    2, 4, 8 and 32."""
    return max(4, min(32, 64 // slots))


# Blocks of the Talker's grouped attention kernel one SM holds (attention_batched.cu: kGroupedBlocksPerSm, 4 for up
# to 2 q heads a KV head).
GROUPED_BLOCKS_PER_SM = 4


def wave_splits(nb: int, kv_heads: int, sms: int) -> int:
    """Chunks per head that fill one wave of the grouped attention kernel at a step of nb streams (blocks: KV heads
    x chunks x streams), at least 1. Its blocks each pay a fixed chain of round trips (the cache tile, q/k norm and
    rotation, the merge) before their share of the context, so at 64 streams (8 KV heads) 4 chunks a head made four
    waves of short blocks (50 us a layer on the H100, context 127) where one chunk a head fills the GPU once."""
    return max(1, GROUPED_BLOCKS_PER_SM * sms // (kv_heads * nb))


def bucket_splits(splits: int, kv_heads: int, sms: int, per_bucket: bool) -> dict[int, int]:
    """The Talker attention's chunks a head at each step bucket: `splits` everywhere, or where per_bucket (batch
    invariance off, no count pinned) and the GPU's multiprocessors are known (sms > 0), at most one wave's."""
    return {nb: min(splits, wave_splits(nb, kv_heads, sms)) if per_bucket and sms else splits for nb in BUCKETS}


def bucket_for(rows: int) -> int:
    """The smallest step size that covers `rows` rows."""
    for b in BUCKETS:
        if rows <= b:
            return b
    raise ValueError(f"{rows} rows: at most {MAX_SLOTS} streams step together")


def param_records(records: list[dict[str, float | int]]) -> np.ndarray:
    """q3t_sample_params records (library.SAMPLE_PARAMS_DTYPE) as host bytes [len(records), record size]."""
    arr = np.zeros(len(records), dtype=library.SAMPLE_PARAMS_DTYPE)
    for i, rec in enumerate(records):
        for key, value in rec.items():
            arr[i][key] = value
    return arr.view(np.uint8).reshape(len(records), library.SAMPLE_PARAMS_DTYPE.itemsize)


def sample_params(records: list[dict[str, float | int]], device: torch.device) -> Tensor:
    """q3t_sample_params records as flat device bytes."""
    return torch.from_numpy(param_records(records).reshape(-1).copy()).to(device)


def upload(arrays: list[np.ndarray], device: torch.device) -> list[Tensor]:
    """Host arrays as device tensors of the same dtypes and shapes, through one pinned, non-blocking copy.

    The copy queues behind the steps in flight and the host goes on at once: a copy from pageable
    memory (torch.tensor(...).to(device)) makes the host wait until the GPU has run everything queued.
    The pinned buffer is not reused before the copy has run (torch's caching host allocator).
    """
    offsets, size = [], 0
    for a in arrays:
        offsets.append(size)
        size += -(-a.nbytes // 8) * 8  # 8-byte aligned parts: each device view can take its dtype
    host = torch.zeros(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    buf = host.numpy()
    for a, at in zip(arrays, offsets):
        buf[at : at + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    dev = host.to(device, non_blocking=True)
    return [dev[at : at + a.nbytes].view(torch.from_numpy(a[:0]).dtype).view(a.shape) for a, at in zip(arrays, offsets)]


def prefill_groups(lengths: list[int], budget: int, max_rows: int | None = None) -> list[range]:
    """Consecutive runs of streams, each prefilled in one forward of at most `budget` padded positions
    (streams x the run's longest prompt) and at most max_rows streams; a prompt longer than the budget runs
    alone."""
    groups, first, longest = [], 0, 0
    for i, n in enumerate(lengths):
        if i > first and ((i - first + 1) * max(longest, n) > budget or (max_rows and i - first >= max_rows)):
            groups.append(range(first, i))
            first, longest = i, 0
        longest = max(longest, n)
    if lengths:
        groups.append(range(first, len(lengths)))
    return groups


def stream_params(sampling: SamplingParams, eos: int) -> tuple[dict[str, float | int], dict[str, float | int]]:
    """The code-0 and CodePredictor draw settings of one stream, as q3t_sample_params fields."""
    code0 = dict(
        flags=library.SAMPLE_DO_SAMPLE if sampling.do_sample else 0,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        penalty=sampling.repetition_penalty,
        eos=eos,
        min_new_tokens=NO_EOS if sampling.suppress_eos else MIN_NEW_TOKENS,
    )
    sub = dict(
        flags=library.SAMPLE_DO_SAMPLE if sampling.subtalker_do_sample else 0,
        temperature=sampling.subtalker_temperature,
        top_k=sampling.subtalker_top_k,
        top_p=sampling.subtalker_top_p,
        penalty=1.0,
        eos=-1,
        min_new_tokens=0,
    )
    return code0, sub


@dataclass(frozen=True)
class Admission:
    """A stream joining the decoder: the free slot it takes, its prompt, draw settings and seed."""

    slot: int
    prompt: Prompt
    sampling: SamplingParams
    seed: int


class BatchedDecoder:
    """Up to `slots` streams of one model stepping together on the q3t batched kernels.

    ops, weights: a KernelBackend's (backend.ops, backend.weights), so both share the weights.
    max_seq: Talker positions per slot (prompt + frames + 1); max_trailing: trailing-text rows per slot.
    attn_splits: the Talker attention's blocks per head (None: attention_splits(slots), and where batch invariance
    is off a step of more streams than fill the GPU takes fewer, wave_splits).
    graphs False: steps launch eagerly (tests, profiling).
    prefills, prefill_cache: a one-stream backend's captured prefill graphs and the cache they write: up to
    GRAPHED_ADMISSIONS streams joining together are prefilled through them (where their graphs are captured)
    and their K/V copied into their slots; None: every admission runs the eager batched forward.
    pdl: launch with programmatic dependent launch where the device has it (KernelOptions.pdl).
    invariant False: a lone busy slot steps on the batch-1 frame's kernels (lone.py), its Talker attention in
    lone_splits chunks per head (KernelOptions.attn_splits; lone_cp_persistent: its CodePredictor positions
    2..15 in one persistent launch, KernelOptions.cp_persistent), and up to PAIRED_ROWS streams run the
    CodePredictor's first two positions together; True (batch invariance, the batch_invariant setting): every
    step is the batched one, the positions one after the other.
    blas_rows: from this many rows (a step's bucket) the matrix products of bf16 weights run on the vendor BLAS
    (gemm.py) instead of the batched GEMV; 0: never. Off under batch invariance."""

    def __init__(
        self,
        model: Qwen3TTSModel,
        ops: Ops,
        weights: ModelWeights,
        *,
        slots: int,
        max_seq: int,
        max_trailing: int = 512,
        attn_splits: int | None = None,
        graphs: bool = True,
        prefills: PrefillGraphs | None = None,
        prefill_cache: KVCache | None = None,
        pdl: bool = True,
        invariant: bool = False,
        lone_splits: int = 32,
        lone_cp_persistent: bool = False,
        blas_rows: int = 0,
    ) -> None:
        if not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"slots={slots}: 1..{MAX_SLOTS}")
        self.model, self.ops, self.w = model, ops, weights
        self.slots, self.max_seq, self.max_trailing = slots, max_seq, max_trailing
        self.rows = bucket_for(slots)  # per-row buffers cover the largest bucket a step may use
        self.tc, self.cc = tc, cc = model.cfg.talker, model.cfg.code_predictor
        self.eos_id = tc.codec_eos_token_id
        dev, dtype = model.device, model.dtype
        rows = self.rows
        self.cache = torch.zeros(
            rows, tc.num_hidden_layers, 2, max_seq, tc.num_key_value_heads, tc.head_dim, dtype=dtype, device=dev
        )
        self.cp_cache = torch.zeros(
            rows, cc.num_hidden_layers, 2, NUM_GROUPS, cc.num_key_value_heads, cc.head_dim, dtype=dtype, device=dev
        )
        self.rope = {}
        for cfg, n in ((tc, max_seq), (cc, NUM_GROUPS)):
            cos, sin = rope_tables(torch.arange(n, device=dev), cfg.head_dim, cfg.rope_theta, torch.float32)
            self.rope[id(cfg)] = (cos.contiguous(), sin.contiguous())
        self.splits = attention_splits(slots) if attn_splits is None else attn_splits
        # Per step bucket (a row's sums then depend on its bucket, so not under batch invariance).
        sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 0
        self.bucket_splits = bucket_splits(
            self.splits, tc.num_key_value_heads, sms, per_bucket=not invariant and attn_splits is None
        )
        self.pos, self.step_index = (
            torch.zeros(rows, dtype=torch.int32, device=dev),
            torch.zeros(rows, dtype=torch.int32, device=dev),
        )
        self.seed = torch.zeros(rows, dtype=torch.int64, device=dev)
        blank: list[dict[str, float | int]] = [{}] * rows
        self.params_code0, self.params_sub = sample_params(blank, dev), sample_params(blank, dev)
        self.seen = torch.zeros(rows, tc.vocab_size, dtype=torch.uint8, device=dev)
        self.trailing = torch.zeros(rows, max_trailing, tc.hidden_size, dtype=torch.float32, device=dev)
        self.n_trailing = torch.zeros(rows, dtype=torch.int32, device=dev)
        self.pad = torch.zeros(rows, tc.hidden_size, dtype=torch.float32, device=dev)
        self.history = torch.full((rows, max_seq, NUM_GROUPS), -1, dtype=torch.int32, device=dev)
        self.slot = torch.full((rows,), -1, dtype=torch.int32, device=dev)  # row r runs slot r, or pads (-1)
        self.x, self.hn = (
            torch.zeros(rows, tc.hidden_size, dtype=torch.float32, device=dev),
            torch.zeros(rows, tc.hidden_size, dtype=torch.float32, device=dev),
        )
        self.cx, self.e1 = (
            torch.zeros(rows, cc.hidden_size, dtype=torch.float32, device=dev),
            torch.zeros(rows, cc.hidden_size, dtype=torch.float32, device=dev),
        )
        self.cur = torch.zeros(rows, NUM_GROUPS, dtype=torch.int32, device=dev)
        self.logits, self.cp_logits = (
            torch.zeros(rows, tc.vocab_size, dtype=torch.float32, device=dev),
            torch.zeros(rows, cc.vocab_size, dtype=torch.float32, device=dev),
        )
        # The CodePredictor's work buffers hold positions 0 and 1 of up to PAIRED_ROWS rows at once.
        self.paired = not invariant  # batch invariance keeps the positions apart at every nb
        cp_rows = max(rows, 2 * min(rows, PAIRED_ROWS)) if self.paired else rows
        self.work = {
            id(cfg): (
                torch.zeros(
                    n,
                    (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim,
                    dtype=torch.float32,
                    device=dev,
                ),
                torch.zeros(n, cfg.num_attention_heads * cfg.head_dim, dtype=torch.float32, device=dev),
                torch.zeros(n, cfg.intermediate_size, dtype=torch.float32, device=dev),
            )
            for cfg, n in ((tc, rows), (cc, cp_rows))
        }
        self.cx2 = torch.zeros(
            min(rows, PAIRED_ROWS), 2, cc.hidden_size, dtype=torch.float32, device=dev
        )  # row r: positions 0 and 1
        hq = tc.num_attention_heads
        self.scratch = torch.zeros(rows * (hq * self.splits * (tc.head_dim + 2) + hq), dtype=torch.float32, device=dev)
        # The batched GEMVs' split-K partials and counters (zero once; each call leaves the counters 0).
        self.gemv_scratch = torch.zeros(
            max(ops.batched_gemv_scratch_floats(self.matrices()), 1), dtype=torch.float32, device=dev
        )
        # Steps of blas_rows streams or more multiply on the vendor BLAS (gemm.py), where a bucket reaches that many,
        # the device's torch can and batch invariance is off; blas_rows then reads 0 wherever it never will.
        usable = not invariant and 0 < blas_rows <= rows and dev.type == "cuda" and blas_supported(dev)
        self.blas = BlasProducts(ops, self.matrices(), max(rows, cp_rows), dev) if usable else None
        self.blas_rows = blas_rows if usable else 0
        self.on_blas = False  # the step being launched multiplies on the BLAS (set by launch_step)
        self.active = [False] * rows
        self.prefills, self.prefill_cache = prefills, prefill_cache
        self.graphed_admissions = 0  # streams admitted through the one-stream prefill graphs (tests, logs)
        self.batch_prefills: BatchedPrefillGraphs | None = None  # capture_prefills()
        self.batch_graphed_admissions = 0  # streams admitted through a captured batched prefill (tests, logs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.lone = None if invariant else LoneStep(self, lone_splits, lone_cp_persistent)
        self.lone_steps = 0  # steps run as a lone slot's batch-1 frame (tests, logs)
        self.pdl = pdl if model.device.type == "cuda" else False
        if graphs:
            self._capture_all()

    @staticmethod
    def row_bytes(cfg: Qwen3TTSConfig, dtype: torch.dtype, max_seq: int, max_trailing: int = 512) -> int:
        """Device bytes one row (slot) of a decoder holds: its Talker KV cache, which is nearly all of it, its
        trailing text, code history, penalty set and CodePredictor cache (the row vectors, a few KiB, left out)."""
        tc, cc = cfg.talker, cfg.code_predictor
        elem = torch.empty(0, dtype=dtype).element_size()
        cache = tc.num_hidden_layers * 2 * max_seq * tc.num_key_value_heads * tc.head_dim * elem
        cp_cache = cc.num_hidden_layers * 2 * NUM_GROUPS * cc.num_key_value_heads * cc.head_dim * elem
        return cache + cp_cache + max_trailing * tc.hidden_size * 4 + max_seq * NUM_GROUPS * 4 + tc.vocab_size

    def matrices(self) -> list[Matrix]:
        """Every weight matrix a step multiplies (the GEMV scratch covers the largest need)."""
        w = self.w
        layers = (*w.talker.layers, *w.code_predictor.layers)
        mats = [m for L in layers for m in (L.qkv, L.o, L.gate_up, L.down)]
        return [*mats, w.codec_head, *w.lm_heads, *([w.proj_w] if w.proj_w is not None else [])]

    def gemv(self, w: Matrix, x: Tensor, y: Tensor, stream: int, **kw) -> None:
        """ops.batched_gemv on the decoder's scratch (the tensor-core kernel for bf16 and int8 on CUDA), or, in a
        step of blas_rows streams or more, the same product on the vendor BLAS (gemm.py)."""
        if self.blas is not None:
            if self.on_blas and self.blas.takes(w):
                self.blas(w, x, y, stream, **kw)
                return
            self.blas.forget()
        self.ops.batched_gemv(w, x, y, scratch=self.gemv_scratch, stream=stream, **kw)

    # -- streams -------------------------------------------------------------------------------
    def admit(self, slot: int, prompt: Prompt, sampling: SamplingParams, seed: int) -> None:
        """One stream joins: admit_all of one."""
        self.admit_all([Admission(slot, prompt, sampling, seed)])

    def admit_all(self, streams: Sequence[Admission]) -> None:
        """Prefill each stream's prompt into its slot and run them all from the next step.

        One batched torch Talker forward over the prompts (Transformer.prefill_rows; more than one
        when they are long, see PREFILL_POSITIONS), then each slot's state: the scalars and sampling
        records of all streams in one host-to-device copy, each buffer set for all of them by one
        index op. Everything is queued on the current stream behind the steps in flight; the host
        never waits for the GPU here.
        """
        slots = [a.slot for a in streams]
        if len(set(slots)) != len(slots) or any(not 0 <= s < self.slots or self.active[s] for s in slots):
            raise ValueError(f"slots {slots} are not free and distinct")
        for a in streams:
            if a.prompt.length + 2 > self.max_seq:
                raise ValueError(f"the prompt has {a.prompt.length} positions; a slot holds {self.max_seq}")
        model = self.model
        n_trailing = [min(a.prompt.trailing.shape[0], self.max_trailing) for a in streams]
        params = [stream_params(a.sampling, self.eos_id) for a in streams]
        index, slot32, n_trail, pos, seed, code0, sub = upload(
            [
                np.array(slots, dtype=np.int64),
                np.array(slots, dtype=np.int32),
                np.array(n_trailing, dtype=np.int32),
                np.array([a.prompt.length for a in streams], dtype=np.int32),
                np.array([a.seed & 0xFFFF_FFFF_FFFF_FFFF for a in streams], dtype=np.uint64).view(np.int64),
                param_records([p[0] for p in params]),
                param_records([p[1] for p in params]),
            ],
            model.device,
        )
        with torch.inference_mode():
            if self._graphed(streams):
                graphs, staging = self.prefills, self.prefill_cache
                assert graphs is not None and staging is not None
                for a in streams:  # in stream order: each replay overwrites staging after the last copy
                    n = a.prompt.length
                    # No capture here, on the scheduler thread while other streams decode: a voice prefix is
                    # used where the warm-up captured the graph of the rest.
                    graphs.prefill(a.prompt.embeds, staging, a.prompt.prefix, capture=False)
                    self.cache[a.slot, :, :, :n].copy_(staging.data[:, :, :n])
                    self.hn[a.slot].copy_(graphs.hn)
                self.graphed_admissions += len(streams)
            else:
                # Groups no larger than the largest captured batched prefill: 64 arrivals replay its graph
                # four times (one launch each) rather than one eager forward of ~1,700 launches from Python;
                # at these sizes the prefill's matrix products, not the weight reads, take its GPU time.
                most = max(self.batch_prefills.rows) if self.batch_prefills else None
                for rows in prefill_groups([a.prompt.length for a in streams], PREFILL_POSITIONS, most):
                    prompts = [streams[r].prompt.embeds.to(model.dtype) for r in rows]
                    group = index[rows.start : rows.stop]
                    last = pos[rows.start : rows.stop].long() - 1
                    shape = self.batch_prefills.shape([p.shape[0] for p in prompts]) if self.batch_prefills else None
                    if shape is not None:
                        assert self.batch_prefills is not None
                        hidden = self.batch_prefills.prefill(prompts, group, last, shape)
                        self.batch_graphed_admissions += len(prompts)
                    else:
                        hidden = model.talker.model.prefill_rows(prompts, self.cache, group, last)
                    self.hn.index_copy_(0, group, hidden.float())
            for a, s, m in zip(streams, slots, n_trailing):
                self.trailing[s, :m].copy_(a.prompt.trailing[:m])
            self.pad.index_copy_(0, index, torch.stack([a.prompt.pad for a in streams]).float())
            self.n_trailing.index_copy_(0, index, n_trail)
            self.pos.index_copy_(0, index, pos)
            self.step_index.index_fill_(0, index, 0)
            self.seed.index_copy_(0, index, seed)
            self.seen.index_fill_(0, index, 0)
            size = library.SAMPLE_PARAMS_DTYPE.itemsize
            self.params_code0.view(-1, size).index_copy_(0, index, code0)
            self.params_sub.view(-1, size).index_copy_(0, index, sub)
            self.slot.index_copy_(0, index, slot32)
        for s in slots:
            self.active[s] = True

    def capture_prefills(self, max_positions: int = WARM_PREFILL_POSITIONS) -> int:
        """Capture the batched prefills that more than GRAPHED_ADMISSIONS arrivals at once replay: 8 and 16 rows
        (those the decoder's slots cover), every bucket up to max_positions within PREFILL_POSITIONS padded
        positions. Only while no stream runs (the warm-up runs write slots 0..15). Returns how many."""
        if any(self.active):
            raise RuntimeError("the batched prefill graphs are captured while no stream runs")
        if self.model.device.type != "cuda":
            return 0
        rows = tuple(r for r in BATCHED_PREFILL_ROWS if r <= self.rows)
        if not rows:
            return 0
        if self.batch_prefills is None:
            self.batch_prefills = BatchedPrefillGraphs(
                self.model.talker.model, self.cache, rows, min(max_positions, self.max_seq)
            )
        return self.batch_prefills.capture_all(PREFILL_POSITIONS)

    def _graphed(self, streams: Sequence[Admission]) -> bool:
        """Whether these arrivals are prefilled through the captured one-stream graphs (few, all captured)."""
        if self.prefills is None or self.prefill_cache is None or len(streams) > GRAPHED_ADMISSIONS:
            return False
        return all(self.prefills.captured(a.prompt.length, self.prefill_cache) for a in streams)

    def release(self, slot: int) -> None:
        """The slot's stream leaves: from the next step its row pads (stream-ordered, no sync)."""
        self.slot[slot : slot + 1].fill_(-1)
        self.active[slot] = False

    @property
    def nb(self) -> int:
        """The bucket the next step runs: it covers the highest busy slot (0 when none is)."""
        busy = [s for s in range(self.slots) if self.active[s]]
        return bucket_for(busy[-1] + 1) if busy else 0

    def lone_slot(self) -> int | None:
        """The busy slot when exactly one is busy and lone steps are on: its step is the batch-1 frame."""
        if self.lone is None or self.active.count(True) != 1:
            return None
        return self.active.index(True)

    # -- the step --------------------------------------------------------------------------------
    def step(self, nb: int | None = None) -> None:
        """One frame for every busy slot (rows [0, nb)); the codes land in history[slot, frame] and, for
        slot s, in cur[s]."""
        nb = self.nb if nb is None else nb
        if nb == 0:
            return
        if not self.graphs:  # eager steps (graphs=False) launch with the decoder's PDL setting
            self.ops.use_pdl(self.pdl)
        lone = self.lone_slot()
        if lone is not None:
            assert self.lone is not None
            self.lone.step(lone)
            self.lone_steps += 1
            return
        graph = self.graphs.get(nb)
        if graph is not None:
            graph.replay()
        else:
            self.launch_step(nb, torch.cuda.current_stream(self.model.device).cuda_stream)

    def _capture_all(self) -> None:
        """One graph per bucket, and per slot for lone steps, captured while no slot is busy (an eager step
        first loads the kernels; with every row padding, neither it nor the captures write any slot's
        state), with PDL as asked (the library's one flag, read at each launch and capture)."""
        assert not any(self.active)
        device = self.model.device
        self.pdl = self.ops.use_pdl(self.pdl)
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for nb in BUCKETS:
                if nb <= self.rows:
                    self.launch_step(nb, side.cuda_stream)
        torch.cuda.current_stream(device).wait_stream(side)
        pool = None
        for nb in BUCKETS:
            if nb > self.rows:
                break
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.launch_step(nb, torch.cuda.current_stream(device).cuda_stream)
            pool = graph.pool()
            self.graphs[nb] = graph
        if self.lone is not None:
            self.lone.capture_all(pool)

    def _layers(self, stack: StackWeights, x: Tensor, nb: int, stream: int, pos_add: int | None) -> None:
        """Every layer of a stack for rows [0, nb): the Talker (pos_add None: each row's slot and
        position) or the CodePredictor at position pos_add of each row's short cache (PAIRED: positions
        0 and 1 together, x [2 nb, H] row-major by row then position)."""
        ops, c = self.ops, stack.cfg
        eps, scale = c.rms_norm_eps, c.head_dim**-0.5
        cos, sin = self.rope[id(c)]
        qkv, attn, mlp = (t[: x.shape[0]] for t in self.work[id(c)])
        gemv = self.gemv
        for i, L in enumerate(stack.layers):
            gemv(L.qkv, x, qkv, stream, norm_w=L.in_norm, eps=eps)
            if pos_add == PAIRED:  # x [2 nb, H]: each row's positions 0 and 1 (its short cache empty)
                ops.batched_rope_attention_first(
                    qkv.view(nb, 2, -1),
                    L.q_norm,
                    L.k_norm,
                    cos,
                    sin,
                    self.cp_cache[0, i, 0],
                    self.cp_cache[0, i, 1],
                    attn.view(nb, 2, -1),
                    row_rows=self.cp_cache.shape[1] * 2 * NUM_GROUPS,
                    eps=eps,
                    scale=scale,
                    stream=stream,
                )
            elif pos_add is None:
                ops.batched_rope_attention_split(
                    qkv,
                    L.q_norm,
                    L.k_norm,
                    cos,
                    sin,
                    self.cache[0, i, 0],
                    self.cache[0, i, 1],
                    attn,
                    slot=self.slot[:nb],
                    pos=self.pos,
                    slot_rows=self.cache.shape[1] * 2 * self.max_seq,
                    eps=eps,
                    scale=scale,
                    splits=self.bucket_splits[bucket_for(nb)],
                    scratch=self.scratch,
                    stream=stream,
                )
            else:
                ops.batched_rope_attention(
                    qkv,
                    L.q_norm,
                    L.k_norm,
                    cos,
                    sin,
                    self.cp_cache[0, i, 0],
                    self.cp_cache[0, i, 1],
                    attn,
                    row_rows=self.cp_cache.shape[1] * 2 * NUM_GROUPS,
                    eps=eps,
                    scale=scale,
                    pos_add=pos_add,
                    stream=stream,
                )
            gemv(L.o, attn, x, stream, mode=library.GEMV_ADD)
            gemv(L.gate_up, x, mlp, stream, mode=library.GEMV_SWIGLU, norm_w=L.post_norm, eps=eps)
            gemv(L.down, mlp, x, stream, mode=library.GEMV_ADD)

    def launch_step(self, nb: int, stream: int) -> None:
        """Launch one step for rows [0, nb) on `stream` (what each graph captures)."""
        ops, w, tc, cc = self.ops, self.w, self.tc, self.cc
        slot, hn, x, cx, e1, cur = self.slot[:nb], self.hn[:nb], self.x[:nb], self.cx[:nb], self.e1[:nb], self.cur[:nb]
        self.on_blas = self.blas is not None and nb >= self.blas_rows
        self.gemv(w.codec_head, hn, self.logits[:nb], stream)
        # Code 0; its CodePredictor input row goes beside position 0 (paired), or waits in e1 until it has run.
        paired = self.paired and nb <= PAIRED_ROWS
        x2 = self.cx2[:nb]
        code0_row, code0_stride = (x2[:, 1], 2 * cc.hidden_size) if paired else (e1, cc.hidden_size)
        ops.batched_sample(
            self.logits[:nb],
            cur,
            params=self.params_code0,
            seen=self.seen,
            suppress=(tc.vocab_size - 1024, tc.vocab_size),
            stream_id=0,
            out_stride=NUM_GROUPS,
            row_table=w.cp_inputs[0],
            row_out=code0_row,
            row_stride=code0_stride,
            slot=slot,
            seed=self.seed,
            step=self.step_index,
            stream=stream,
        )
        if w.proj_w is not None:
            self.gemv(w.proj_w, hn, cx, stream, bias=w.proj_b)
        else:
            cx.copy_(hn)
        if paired:  # positions 0 (the projected hn) and 1 (code 0's row) through the layers together
            x2[:, 0].copy_(cx)
            self._layers(w.code_predictor, x2.view(2 * nb, -1), nb, stream, PAIRED)
            cx.copy_(x2[:, 1])
        else:
            self._layers(w.code_predictor, cx, nb, stream, 0)
            cx.copy_(e1)
        for j in range(1, NUM_GROUPS):
            if j > 1 or not paired:
                self._layers(w.code_predictor, cx, nb, stream, j)
            self.gemv(w.lm_heads[j - 1], cx, self.cp_logits[:nb], stream, norm_w=w.cp_norm, eps=cc.rms_norm_eps)
            # The draw writes the next position's input row, except after the last code.
            row_table, row_out, row_stride = (
                (w.cp_inputs[j], cx, cc.hidden_size) if j + 1 < NUM_GROUPS else (None, None, 0)
            )
            ops.batched_sample(
                self.cp_logits[:nb],
                cur[:, j:],
                params=self.params_sub,
                stream_id=j,
                out_stride=NUM_GROUPS,
                row_table=row_table,
                row_out=row_out,
                row_stride=row_stride,
                slot=slot,
                seed=self.seed,
                step=self.step_index,
                stream=stream,
            )
        ops.batched_store_codes(cur, self.history, slot=slot, step=self.step_index, stream=stream)
        ops.batched_embed_sum(
            w.embeddings,
            w.embedding_ptrs,
            cur,
            x,
            slot=slot,
            trailing=self.trailing,
            n_trailing=self.n_trailing,
            pad=self.pad,
            step=self.step_index,
            stream=stream,
        )
        self._layers(w.talker, x, nb, stream, None)
        ops.batched_rmsnorm(x, w.final_norm, hn, eps=tc.rms_norm_eps, stream=stream)
        ops.batched_advance(slot, pos=self.pos, step=self.step_index, stream=stream)
