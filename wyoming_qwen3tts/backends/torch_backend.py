"""The frame decode loop (Talker step + 15 CodePredictor passes + sampling) in plain torch.

This is the reference for the fused-kernel backend and the CPU fallback. A backend's
`start()` prefills the prompt and returns a session; `session.next_frames(n)` returns up to
n frames of 16 codes, fewer once end of speech (code-0 EOS) is sampled or max_frames is hit.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..model.prefix_cache import PrefixCache
from ..model.prompt import Prompt
from ..model.sampling import CodeZeroProcessor, choose
from ..model.talker import KVCache, Qwen3TTSModel
from ..request import SamplingParams


class TorchDecodeSession:
    # DecodeSession: a one-stream session starts at once and holds nothing beyond its own buffers.
    queued_at: float | None = None
    admitted_at: float | None = None
    first_codes_at: float | None = None

    def close(self) -> None:
        pass

    def __init__(
        self,
        model: Qwen3TTSModel,
        prompt: Prompt,
        sampling: SamplingParams,
        seed: int,
        max_frames: int,
        prefixes: PrefixCache | None = None,
    ) -> None:
        self.model = model
        self.sampling = sampling
        self.max_frames = max_frames
        self.prompt = prompt
        cfg = model.cfg.talker
        self.eos_id = cfg.codec_eos_token_id
        self.num_groups = cfg.num_code_groups
        device = model.device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        # EOS is masked for the first two code-0s, as the reference's min_new_tokens=2 does;
        # suppress_eos extends that mask past the last frame.
        min_new = max_frames + 1 if sampling.suppress_eos else 2
        self.processor = CodeZeroProcessor(cfg.vocab_size, self.eos_id, min_new_tokens=min_new, device=device)
        self.cache: KVCache = model.new_talker_cache(prompt.length + max_frames + 1)
        self.cp_cache: KVCache = model.new_predictor_cache()
        self.previous_c0 = torch.empty(0, dtype=torch.long, device=device)
        self.frames_done = 0
        self.finished = False
        self._asked: list[int] = []
        with torch.inference_mode():
            self.hidden = prefill(model, prompt, self.cache, prefixes)  # final-normed h [1, H]

    @torch.inference_mode()
    def _next_frame(self) -> Tensor | None:
        talker = self.model.talker
        cp = talker.code_predictor
        s = self.sampling
        scores = self.processor(talker.codec_head(self.hidden), self.previous_c0, s.repetition_penalty)
        c0 = choose(
            scores,
            do_sample=s.do_sample,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            generator=self.generator,
        )
        self.previous_c0 = torch.cat([self.previous_c0, c0])
        if int(c0.item()) == self.eos_id:  # the one host sync per frame
            return None

        def pick(logits: Tensor) -> Tensor:
            return choose(
                logits.float(),
                do_sample=s.subtalker_do_sample,
                temperature=s.subtalker_temperature,
                top_k=s.subtalker_top_k,
                top_p=s.subtalker_top_p,
                generator=self.generator,
            )

        self.cp_cache.reset()
        c0_embed = talker.embed_codec(c0)
        y = cp.model(cp.project(torch.cat([self.hidden, c0_embed], dim=0)), self.cp_cache)
        codes = [c0, pick(cp.lm_head[0](y[-1:]))]
        embeds = [c0_embed]
        for j in range(2, self.num_groups):
            e = cp.model.codec_embedding[j - 2](codes[-1])
            embeds.append(e)
            y = cp.model(cp.project(e), self.cp_cache)
            codes.append(pick(cp.lm_head[j - 1](y)))
        embeds.append(cp.model.codec_embedding[self.num_groups - 2](codes[-1]))
        frame = torch.cat(codes)

        self.frames_done += 1
        if self.frames_done < self.max_frames:
            step = self.frames_done - 1
            x = torch.stack(embeds, dim=0).sum(0)  # [1, H]; same reduction as the reference
            extra = (
                self.prompt.trailing[step : step + 1] if step < self.prompt.trailing.shape[0] else self.prompt.pad[None]
            )
            self.hidden = talker.model(x + extra, self.cache)[-1:]
        return frame

    def launch(self, n: int) -> None:
        """Ask for the next n frames. The torch loop is synchronous, so the work happens in
        collect(): launching ahead must not delay the audio of the group before."""
        self._asked.append(n)

    def collect(self) -> np.ndarray:
        """The frames of the oldest launch (fewer once end of speech or max_frames is reached)."""
        return self._decode(self._asked.pop(0) if self._asked else 0)

    def next_frames(self, n: int) -> np.ndarray:
        self.launch(n)
        return self.collect()

    def _decode(self, n: int) -> np.ndarray:
        frames: list[Tensor] = []
        while len(frames) < n and not self.finished:
            if self.frames_done >= self.max_frames:
                self.finished = True
                break
            frame = self._next_frame()
            if frame is None:
                self.finished = True
                break
            frames.append(frame)
        if not frames:
            return np.zeros((0, self.num_groups), dtype=np.int64)
        return torch.stack(frames).cpu().numpy().astype(np.int64)


def prefill(model: Qwen3TTSModel, prompt: Prompt, cache: KVCache, prefixes: PrefixCache | None) -> Tensor:
    """The Talker over the prompt into an empty cache; returns the last position's final-normed hidden state [1, H].
    A cached prefix's K/V are copied in and only the positions after it run; a missed prefix is stored."""
    prefix = prompt.prefix if prefixes is not None else None
    kv = prefixes.kv_for(prefix) if prefixes is not None and prefix is not None else None
    if kv is not None and prefix is not None:
        cache.data[:, :, : prefix.length].copy_(kv)
        cache.length = prefix.length
        return model.talker.model(prompt.embeds[prefix.length :], cache)[-1:]
    hidden = model.talker.model(prompt.embeds, cache)[-1:]
    if prefixes is not None and prefix is not None:
        prefixes.keep(prefix, cache.data)
    return hidden


class TorchBackend:
    name = "torch"
    # DecodeBackend: sessions interleave at frame-group boundaries under the engine's lock, one at a time.
    concurrent_sessions = False
    exclusive_sessions = False
    thread_safe_sessions = False
    max_streams = 1

    def warm_up(self) -> int:
        return 0  # nothing captured: the torch path has no graphs

    def __init__(self, model: Qwen3TTSModel, prefixes: PrefixCache | None = None) -> None:
        self.model = model
        self.prefixes = prefixes  # the voices' prompt-prefix K/V (None: every prompt prefilled whole)
        # The reference path keeps the reference's ops, also after a kernel backend that failed to load had fused
        # the prefill's (KernelOptions.fused_prefill).
        model.talker.model.use_fused_ops(False)

    def start(self, prompt: Prompt, sampling: SamplingParams, seed: int, max_frames: int) -> TorchDecodeSession:
        return TorchDecodeSession(self.model, prompt, sampling, seed, max_frames, self.prefixes)
