"""Decode backends: the talker's frame loop on torch (torch_backend.py) or on the fused kernels (kernels/).

What a backend and its sessions offer the engine is declared here (DecodeBackend, DecodeSession), so
the engine reads capabilities instead of probing for them; `make_backend` picks one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..model.codec import CodecDecoder
    from ..model.prompt import Prompt
    from ..model.talker import Qwen3TTSModel
    from ..request import SamplingParams
    from .kernels.options import KernelOptions

_LOGGER = logging.getLogger(__name__)


class DecodeSession(Protocol):
    """One sentence's frame loop on a backend."""

    finished: bool

    # When the batching backend queued, admitted and produced the first codes of it (monotonic seconds);
    # None on the one-stream backends, which run a session at once. Read-only here: the engine only reads
    # them, and a backend that always knows one (the batching one's queued_at) may declare it a float.
    @property
    def queued_at(self) -> float | None: ...
    @property
    def admitted_at(self) -> float | None: ...
    @property
    def first_codes_at(self) -> float | None: ...

    def launch(self, n: int) -> None | int: ...  # ask for the next n frames (may start them at once)

    def collect(self) -> np.ndarray: ...  # codes of the oldest launch, [k <= n, 16]

    def next_frames(self, n: int) -> np.ndarray: ...  # launch(n) then collect()

    def close(self) -> None: ...  # free what the session holds (the batching backend: its slot) now


@runtime_checkable
class GroupSink(Protocol):
    """Where a session may hand its frame groups itself (the codec worker's stream): submit() starts decoding one, and
    the decode of the same array then only waits for it."""

    def submit(self, codes: np.ndarray) -> None: ...

    def wait_launched(self, timeout: float) -> torch.cuda.Event | None:
        """Wait up to `timeout` s until the submitted group's decode is queued on the GPU; the CUDA event recorded
        after it, or None (not queued in time, failed, or no GPU)."""
        ...


@runtime_checkable
class HandsGroupsOver(Protocol):
    """A session that can hand its groups to a GroupSink as they are decoded (the batching backend's)."""

    def hand_groups_to(self, sink: GroupSink) -> None: ...


@runtime_checkable
class GathersArrivals(Protocol):
    """A backend that may wait for prompts still being built, to admit them together (the batching backend's
    admit_gather): the engine says so before it builds a request's prompt, and start() on the same thread takes it."""

    def expect_arrival(self) -> None: ...  # this thread builds a prompt it will start() here

    def forget_arrival(self) -> None: ...  # it will not (the request failed first); a no-op after start()


@runtime_checkable
class FusesCodec(Protocol):
    """A backend with kernels for the codec decoder too (the kernel backends': its SnakeBeta activations)."""

    def fuse_codec(self, codec: CodecDecoder) -> None: ...  # before the codec's calls are captured


class DecodeBackend(Protocol):
    """Starts decode sessions; says how many may run at once."""

    name: str
    # Sessions may run side by side, each collect() waiting for its own frames (the batching backend);
    # False: the engine runs one session at a time.
    concurrent_sessions: bool
    # Sessions share the backend's device buffers (the captured frame graph): one whole request at a time.
    exclusive_sessions: bool
    thread_safe_sessions: bool  # collect() may be called without the engine's lock
    max_streams: int  # sessions decoded together at most

    def start(self, prompt: Prompt, sampling: SamplingParams, seed: int, max_frames: int) -> DecodeSession: ...

    def warm_up(self) -> int: ...  # capture what a first request would otherwise wait for; returns what was captured


def make_backend(
    name: str,
    model: Qwen3TTSModel,
    kernels: KernelOptions | None = None,
    *,
    max_streams: int = 1,
    max_seq: int | None = None,
    batch_invariant: bool = False,
    prefix_cache_bytes: int = 0,
) -> tuple[DecodeBackend, str]:
    """The decode backend asked for; 'auto' takes the fused kernels where they load, else torch.
    max_streams > 1 on the kernels: the batching backend (continuous batching, max_seq positions a stream);
    0: as many streams as the GPU's free memory holds (1 means the one-stream backend). prefix_cache_bytes > 0:
    voices' prompt prefixes are prefilled once and their K/V kept, up to that many bytes (model/prefix_cache.py)."""
    import torch

    from ..errors import Qwen3TTSError
    from ..model.prefix_cache import PrefixCache
    from .torch_backend import TorchBackend

    prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None

    if name == "torch":
        return TorchBackend(model, prefixes), "asked for"
    if model.device.type != "cuda":
        if name == "kernels":
            raise Qwen3TTSError("backend 'kernels' needs a GPU; this engine runs on the CPU")
        return TorchBackend(model, prefixes), "no GPU: fused kernels need CUDA or ROCm"
    try:
        from .kernels.backend import KernelBackend

        chosen = KernelBackend(model, kernels, prefixes=prefixes)
        lib = chosen.lib
        # Which kernel build runs: the cached library (its name carries the source hash and archs).
        reason = f"kernels {lib.path.name}, warp {lib.warp_size}, {lib.sm_count} compute units"
        if max_streams != 1:
            if max_seq is None:
                raise ValueError("batched decoding needs max_seq, the positions a stream may use")
            if max_streams == 0:
                from .kernels.batched import BatchedDecoder
                from .kernels.scheduler import streams_for_memory

                free, _total = torch.cuda.mem_get_info(model.device)
                max_streams, why = streams_for_memory(free, BatchedDecoder.row_bytes(model.cfg, model.dtype, max_seq))
                _LOGGER.info("max_streams auto: %d (%s)", max_streams, why)
            if max_streams > 1:
                from .kernels.scheduler import BatchingBackend

                batching = BatchingBackend(chosen, max_streams, max_seq, invariant=batch_invariant)
                cache_gib = batching.decoder.cache.numel() * batching.decoder.cache.element_size() / 1024**3
                _LOGGER.info(
                    "Continuous batching: up to %d streams of %d positions each (KV cache %.2f GiB)",
                    max_streams,
                    max_seq,
                    cache_gib,
                )
                return batching, reason + f", {max_streams} streams batched" + (
                    ", batch-invariant" if batch_invariant else ""
                )
        return chosen, reason
    except Exception as err:  # a missing toolchain or a failed build must not stop the service
        if name == "kernels":
            raise
        _LOGGER.warning("Fused kernels unavailable, using the torch path: %s", err)
        return TorchBackend(model, prefixes), f"kernels unavailable: {err}"
