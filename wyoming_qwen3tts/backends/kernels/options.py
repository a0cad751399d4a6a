"""What stays configurable in the kernel backend, and the one place it is read from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelOptions:
    """Kernel backend options (kernels/README.md documents them and their environment variables)."""

    # Programmatic dependent launch: each kernel launches and loads its weights while the one before
    # it runs (CUDA sm_90+; ~10 % per frame on the H200). Where the device has none it is left off.
    pdl: bool = True
    # The most chunks the Talker attention cuts the context into per head (a chunk holds at least 16
    # positions, so a short context uses fewer).
    attn_splits: int = 32
    # The prompt prefill replayed as one captured graph per bucket length instead of ~1,700 launches
    # issued from Python.
    graph_prefill: bool = True
    # The tensor-core batched GEMV's split K summed across a thread-block cluster (CUDA sm_90+) where its
    # plan allows, else through global scratch: the same bits, ~4 % of a 16-stream step.
    gemv_clusters: bool = True
    # More than 16 streams' vectors in one tensor-core GEMV launch (16 at a time inside each block, each matrix
    # read once a step) instead of a launch per 16: the same bits, but slower on the H200 (64 streams 3,689
    # against 3,872 frames/s, docs/performance.md), so off.
    gemv_groups: bool = False
    # CodePredictor positions 2..15 of a lone stream's frame in one persistent launch (q3t_cp_passes: weights
    # streamed into shared memory ahead of each phase, a counter barrier between phases; CUDA sm_90+, bf16)
    # instead of 14 x 27 launches. Slower on the H200 (1.7B 270 against 326 frames/s: every phase is a chain of
    # L2 round trips that costs more than a launch under PDL; docs/performance.md), so off; kept for the next try.
    cp_persistent: bool = False
    # int8 GEMVs planned for the most 16-byte loads in flight per lane (the smaller grid of equal waves), where
    # bf16's rule (the larger grid) leaves an int8 lane half a bf16 lane's bytes. Slower on the H100 (1.7B int8 280
    # against 304 frames/s, no faster GEMVs: docs/int8.md), so off.
    i8_deep: bool = False
    # A lone stream's int8 GEMVs on int8 tensor cores (CUDA sm_80+; gemv_i8_mma.cu: x as four int8 digits of one
    # power-of-two scale, the sums exact integers, no instruction per weight) instead of the FMA kernels, which
    # widen each weight to float32 (three instructions a weight). Slower on the H100 (the 1.7B int8 frame 2.81
    # against 2.47 ms: each block turning x into digits costs more than the arithmetic it saves; docs/int8.md), so
    # off; kept for a next try that makes the digits once per vector.
    i8_mma: bool = False
    # Batched steps of this many streams or more (a bucket: 32 or 64) run their bf16 matrix products on the vendor
    # BLAS (cuBLAS / hipBLASLt through torch, gemm.py: each weight read once for all rows on tensor cores) instead
    # of the batched GEMV, which reads each matrix once per 16 streams; 0: never. Not under batch invariance.
    blas_rows: int = 32
    # The batched decoder's Talker attention chunks per head at every step; 0: its own choice (4 up to 16 slots, and
    # where batch invariance is off one wave of blocks at larger steps: 2 at 32 streams, 1 at 64 on a 132-SM GPU).
    batched_attn_splits: int = 0
    # Batched steps the scheduler launches ahead of the oldest whose codes it has not read back (scheduler.py): more
    # hide the host's pauses between launches (the interpreter's lock, shared with the request threads); fewer put
    # an arriving stream's prefill behind fewer queued steps, a step sooner to its first audio.
    steps_ahead: int = 2
    # A newly admitted stream's first group gets the GPU to itself: the scheduler reads back the step that made it
    # before launching another, and the next step waits on the GPU for the codec call that turns it into audio
    # (scheduler.py, BatchingBackend._yield_to_first_audio). Off, that call ran beside the steps launched ahead and
    # took 7.0 ms instead of 2.5 alone (H100, a lone request: docs/performance.md).
    first_audio_hold: bool = True
    # The prompt prefill's norms and attention on torch's fused kernels (Transformer.use_fused_ops): one launch a
    # norm instead of eight, one for the attention instead of ~10, in the captured prefill graphs.
    fused_prefill: bool = True
    # Admissions wait up to this many ms (from the oldest queued stream's arrival) while other requests are still
    # building their prompts, so that prompts arriving together are prefilled together and their first steps and
    # first codec call are one, not one round after another (scheduler.py, Arrivals); 0: admit what is queued at
    # every step boundary. A lone request never waits: nothing else is being built.
    admit_gather_ms: float = 0.0
    # The codec decoder's SnakeBeta activations on the library's fused kernel (q3t_snake_beta, CodecDecoder.use_fused_ops):
    # one pass over each activation where torch's five ops make ~11, written behind the next conv's left context;
    # the same samples (each op rounded as torch rounds it).
    fused_codec: bool = True
    # The codec decoder's convs of kernel > 1 with at least this many input channels may run as one GEMM each on
    # the vendor BLAS (CodecDecoder.use_gemm_convs), in a bf16 or fp16 codec: cuDNN runs a few of their shapes 5-10x
    # slower; 0: none.
    codec_gemm_convs: int = 1
    # ... where timed faster, per conv and input shape (codec.gemm_is_faster, when the shape is first met: the codec
    # worker's warm-up); off: always as GEMMs.
    codec_conv_timed: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.attn_splits <= 1024:
            raise ValueError(f"attention splits must be 1..1024, got {self.attn_splits}")
        if not 0 <= self.batched_attn_splits <= 1024:
            raise ValueError(f"batched attention splits must be 0 (auto) or 1..1024, got {self.batched_attn_splits}")
        if not 1 <= self.steps_ahead <= 8:
            raise ValueError(f"steps ahead must be 1..8, got {self.steps_ahead}")
        if not 0 <= self.admit_gather_ms <= 1000:
            raise ValueError(f"admit_gather_ms must be 0..1000, got {self.admit_gather_ms}")
        if self.codec_gemm_convs < 0:
            raise ValueError(f"codec_gemm_convs must be 0 (none) or a channel count, got {self.codec_gemm_convs}")
        if self.blas_rows < 0:
            raise ValueError(f"blas_rows must be 0 (never) or a stream count, got {self.blas_rows}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> KernelOptions:
        """Q3T_PDL=0, Q3T_ATTN_SPLITS=N, Q3T_GRAPH_PREFILL=0, Q3T_GEMV_CLUSTER=0, Q3T_GEMV_GROUPS=1,
        Q3T_CP_PERSISTENT=1, Q3T_I8_DEEP=1, Q3T_I8_MMA=1, Q3T_BLAS_ROWS=N (0: never), Q3T_BATCHED_ATTN_SPLITS=N (0: auto) and
        Q3T_STEPS_AHEAD=N, Q3T_FIRST_AUDIO_HOLD=0, Q3T_FUSED_PREFILL=0, Q3T_ADMIT_GATHER_MS=N, Q3T_FUSED_CODEC=0,
        Q3T_CODEC_GEMM_CONVS=N and Q3T_CODEC_CONV_TIMED=0 override the defaults."""
        return cls(
            pdl=env.get("Q3T_PDL", "1") != "0",
            attn_splits=int(env.get("Q3T_ATTN_SPLITS", cls.attn_splits)),
            graph_prefill=env.get("Q3T_GRAPH_PREFILL", "1") != "0",
            gemv_clusters=env.get("Q3T_GEMV_CLUSTER", "1") != "0",
            gemv_groups=env.get("Q3T_GEMV_GROUPS", "0") == "1",
            cp_persistent=env.get("Q3T_CP_PERSISTENT", "0") == "1",
            i8_deep=env.get("Q3T_I8_DEEP", "0") == "1",
            i8_mma=env.get("Q3T_I8_MMA", "0") == "1",
            blas_rows=int(env.get("Q3T_BLAS_ROWS", cls.blas_rows)),
            batched_attn_splits=int(env.get("Q3T_BATCHED_ATTN_SPLITS", cls.batched_attn_splits)),
            steps_ahead=int(env.get("Q3T_STEPS_AHEAD", cls.steps_ahead)),
            first_audio_hold=env.get("Q3T_FIRST_AUDIO_HOLD", "1") != "0",
            fused_prefill=env.get("Q3T_FUSED_PREFILL", "1") != "0",
            admit_gather_ms=float(env.get("Q3T_ADMIT_GATHER_MS", cls.admit_gather_ms)),
            fused_codec=env.get("Q3T_FUSED_CODEC", "1") != "0",
            codec_gemm_convs=int(env.get("Q3T_CODEC_GEMM_CONVS", cls.codec_gemm_convs)),
            codec_conv_timed=env.get("Q3T_CODEC_CONV_TIMED", "1") != "0",
        )
