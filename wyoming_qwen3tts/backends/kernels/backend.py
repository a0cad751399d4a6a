"""The decode backend on our fused kernels: prefill, the captured frame graph, sessions.

Same contract as the torch backend: `start(prompt, sampling, seed, max_frames)` prefills and
returns a session whose `next_frames(n)` gives up to n frames [k, 16] (k < n: end of speech).
The frame (frame.py) is captured once per sampling settings into a CUDA/HIP graph and replayed;
`next_frames(n)` replays it n times and syncs once to read the n frames back. The prompt prefill
runs through the torch Talker (prefill.py) into the same KV cache the kernels then read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from ...model.codec import CodecDecoder
from ...model.prefix_cache import PrefixCache
from ...model.prompt import Prompt
from ...model.talker import Qwen3TTSModel
from ...request import SamplingParams
from . import library
from .frame import NUM_GROUPS, FrameState, fits_short_attention, launch_frame
from .ops import Ops
from .options import KernelOptions
from .prefill import WARM_PREFILL_POSITIONS, PrefillGraphs
from .session import KernelDecodeSession
from .weights import ModelWeights

_LOGGER = logging.getLogger(__name__)


class KernelBackend:
    """Decode loop on the q3t kernels. Raises library.NativeUnavailable where they cannot run."""

    name = "kernels"
    # One decode session at a time: the captured frame graph works on the backend's own buffers.
    concurrent_sessions = False
    exclusive_sessions = True
    thread_safe_sessions = False
    max_streams = 1

    def __init__(
        self,
        model: Qwen3TTSModel,
        options: KernelOptions | None = None,
        *,
        capacity: int = 2048,
        lib: library.Native | None = None,
        prefixes: PrefixCache | None = None,
    ) -> None:
        """options None: KernelOptions.from_env(); lib None: the library library.load() builds or finds;
        prefixes: the voices' prompt-prefix K/V (None: every prompt prefilled whole)."""
        if model.device.type != "cuda":
            raise library.NativeUnavailable("the kernel backend needs the model on a CUDA/ROCm device")
        if model.dtype not in (torch.float32, torch.bfloat16):
            raise library.NativeUnavailable(f"the kernels take float32 or bfloat16 weights, not {model.dtype}")
        if not fits_short_attention(model.cfg.code_predictor, NUM_GROUPS):
            raise library.NativeUnavailable("the CodePredictor's heads do not fit the short-attention kernel")
        self.options = options or KernelOptions.from_env()
        self.lib = lib or library.load(model.device.index or 0)
        self.ops = Ops(self.lib)
        self.ops.set_gemv_clusters(self.options.gemv_clusters)
        self.ops.set_gemv_groups(self.options.gemv_groups)
        self.ops.set_i8_deep(self.options.i8_deep)
        self.ops.set_i8_mma(self.options.i8_mma)
        self.model = model
        self.eos_id = model.cfg.talker.codec_eos_token_id
        self.pdl = self.options.pdl  # turned off at the first capture where the device has no PDL
        self.weights = ModelWeights.from_model(model)
        # The persistent CodePredictor (q3t_cp_passes) takes bf16 matrices on CUDA sm_90+ only.
        cp_matrices = [m for L in self.weights.code_predictor.layers for m in (L.qkv, L.o, L.gate_up, L.down)]
        self.cp_persistent = (
            self.options.cp_persistent
            and torch.version.hip is None
            and torch.cuda.get_device_capability(model.device)[0] >= 9
            and all(m.dtype == torch.bfloat16 for m in (*cp_matrices, *self.weights.lm_heads))
        )
        self.state = FrameState(model.cfg, model.dtype, model.device, capacity, self.options.attn_splits)
        # The torch Talker runs only the prompt prefill here: on torch's fused norm and attention kernels.
        model.talker.model.use_fused_ops(self.options.fused_prefill)
        self.prefills = PrefillGraphs(
            model.talker.model, self.state.hn, model.dtype, enabled=self.options.graph_prefill, prefixes=prefixes
        )
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_key: tuple[object, ...] | None = None
        self._owner: KernelDecodeSession | None = None

    def fuse_codec(self, codec: CodecDecoder) -> None:
        """The codec's SnakeBeta activations on this library's kernel (KernelOptions.fused_codec), where the codec
        runs on this GPU in a dtype the kernel takes, and its convs as GEMMs where timed faster
        (KernelOptions.codec_gemm_convs) where it runs in bf16 or fp16."""
        if codec.device.type != "cuda":
            return
        if self.options.fused_codec and codec.dtype in (torch.float32, torch.bfloat16):
            codec.use_fused_ops(self.ops.snake_beta)
        # Half types only: in float32 cuDNN's convs round as TF32 and the BLAS's GEMMs do not, and the float32 engine
        # is the one held to the torch backend's samples.
        if self.options.codec_gemm_convs and codec.dtype in (torch.bfloat16, torch.float16):
            timed = self.options.codec_conv_timed
            picked = codec.use_gemm_convs(self.options.codec_gemm_convs, timed=timed)
            _LOGGER.debug(
                "Codec convs as GEMMs (%s): %s", "where timed faster" if timed else "always", ", ".join(picked)
            )

    # -- what sessions, tests and device scripts read ----------------------------------------------
    @property
    def capacity(self) -> int:
        return self.state.capacity

    @property
    def history(self) -> Tensor:
        return self.state.history

    def owns(self, session: KernelDecodeSession) -> bool:
        return self._owner is session

    # -- sessions ----------------------------------------------------------------------------------
    def start(self, prompt: Prompt, sampling: SamplingParams, seed: int, max_frames: int) -> KernelDecodeSession:
        self._owner = None
        self.prefill(prompt, max_frames)
        seed &= 0xFFFF_FFFF_FFFF_FFFF
        self.state.seed.fill_(seed if seed < 2**63 else seed - 2**64)  # int64 storage of the 64-bit seed
        session = KernelDecodeSession(self, self.frame_graph(sampling), max_frames)
        self._owner = session
        return session

    def prefill(self, prompt: Prompt, max_frames: int) -> None:
        """The decode state for a new prompt: its K/V and last hidden state, trailing text, counters."""
        s = self.state
        need = prompt.length + max_frames + 1
        if need > s.capacity:
            s.grow(max(need, 2 * s.capacity))
        with torch.inference_mode():
            self.prefills.prefill(prompt.embeds, s.cache, prompt.prefix)
            s.load_prompt(prompt)

    def warm_up(self, max_positions: int = WARM_PREFILL_POSITIONS) -> int:
        """Capture the prefill graphs of the common prompt lengths now; returns how many. Writes the
        cache and hn, so it ends any open session."""
        self._owner = None
        with torch.inference_mode():
            return self.prefills.warm_up(self.state.cache, max_positions)

    # -- the frame ---------------------------------------------------------------------------------
    def frame_graph(self, sampling: SamplingParams) -> torch.cuda.CUDAGraph:
        """The captured frame for these sampling settings (captured now if it is not yet); each
        replay decodes one frame from the state the last prefill or replay left."""
        key = (sampling, self.capacity, self.pdl)
        if self._graph is None or self._graph_key != key:
            self._graph = self._capture(sampling)
            self._graph_key = (sampling, self.capacity, self.pdl)
        return self._graph

    def launch_frame(
        self, sampling: SamplingParams, stream: int | None = None, hook: Callable[[int, Tensor], None] | None = None
    ) -> None:
        """One frame launched eagerly (profiling; `hook` as in frame.launch_frame), not captured."""
        self._apply_pdl()
        stream = torch.cuda.current_stream(self.model.device).cuda_stream if stream is None else stream
        launch_frame(self.ops, self.weights, self.state, sampling, stream, hook, cp_persistent=self.cp_persistent)

    def _apply_pdl(self) -> None:
        self.pdl = self.ops.use_pdl(self.pdl)

    def _capture(self, sampling: SamplingParams) -> torch.cuda.CUDAGraph:
        # One eager frame first (it loads every kernel before the capture), on the state it would
        # disturb saved and restored.
        saved = [t.clone() for t in self.state.mutable()]
        device = self.model.device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self.launch_frame(sampling, side.cuda_stream)
        torch.cuda.current_stream(device).wait_stream(side)
        for t, v in zip(self.state.mutable(), saved):
            t.copy_(v)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.launch_frame(sampling, torch.cuda.current_stream(device).cuda_stream)
        return graph

    # -- tests: eager, teacher-forced ----------------------------------------------------------------
    def teacher_forced(
        self, prompt: Prompt, codes: np.ndarray, after_prefill: Callable[[], None] | None = None
    ) -> list[list[Tensor]]:
        """Run frames eagerly with the given codes forced in; returns per frame the 16 logits
        vectors (float32, before the processors): codec_head, then lm_head[0..14].
        `after_prefill` may replace the prefill's cache and hidden state (tests)."""
        self._owner = None
        self.prefill(prompt, len(codes))
        if after_prefill:
            after_prefill()
        out: list[list[Tensor]] = []
        for f in range(len(codes)):
            frame: list[Tensor] = []

            def hook(j: int, logits: Tensor, f: int = f, frame: list[Tensor] = frame) -> None:
                frame.append(logits.clone())
                self.state.codes[j] = int(codes[f, j])

            self.launch_frame(SamplingParams.greedy(), hook=hook)
            out.append(frame)
        torch.cuda.synchronize(self.model.device)
        return out
