"""Logits processing and token choice, in the reference's order (transformers 4.57 generate).

Code 0 (Talker): repetition penalty over earlier code-0s -> min-new-tokens (EOS masked for the
first frames) -> suppressed ids -> [sampling only] temperature -> top-k -> top-p -> softmax +
multinomial, or argmax when greedy. Codes 1..15 (CodePredictor): only temperature/top-k/top-p.
Logits are processed in float32. Draws come from a per-request torch.Generator, one draw per
code in the reference's order, so a seeded CPU run reproduces the reference's seeded output.
"""

from __future__ import annotations

import torch
from torch import Tensor


def repetition_penalty(scores: Tensor, previous: Tensor, penalty: float) -> Tensor:
    """scores [1, V]; previous [1, N] token ids. Positive logits / penalty, negative * penalty."""
    if penalty == 1.0 or previous.numel() == 0:
        return scores
    picked = torch.gather(scores, 1, previous)
    picked = torch.where(picked < 0, picked * penalty, picked / penalty)
    return scores.scatter(1, previous, picked)


def top_k_filter(scores: Tensor, k: int) -> Tensor:
    if k <= 0:
        return scores
    k = min(k, scores.shape[-1])
    kth = torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(scores < kth, float("-inf"))


def top_p_filter(scores: Tensor, p: float) -> Tensor:
    if p >= 1.0:
        return scores
    sorted_scores, sorted_idx = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - p)
    remove_sorted[..., -1:] = False  # keep at least one token
    remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def choose(
    scores: Tensor, *, do_sample: bool, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None
) -> Tensor:
    """scores [1, V] float32 after the processors; returns the chosen id as a [1] int64 tensor.

    The id stays on the scores' device: the torch backend syncs once per frame, not per code.
    """
    if not do_sample:
        return torch.argmax(scores, dim=-1)
    if temperature != 1.0:
        scores = scores / temperature
    scores = top_k_filter(scores, top_k)
    scores = top_p_filter(scores, top_p)
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


class CodeZeroProcessor:
    """The Talker's processors before the choice: penalty, min-new-tokens, suppression."""

    def __init__(self, vocab_size: int, eos_id: int, *, min_new_tokens: int = 2, device: torch.device | str = "cpu"):
        self.eos_id = eos_id
        self.min_new_tokens = min_new_tokens
        # Every id in [vocab - 1024, vocab) is suppressed except EOS: code 0 is an acoustic code or EOS.
        suppressed = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        suppressed[vocab_size - 1024 :] = True
        suppressed[eos_id] = False
        self.suppressed = suppressed

    def __call__(self, logits: Tensor, previous: Tensor, penalty: float) -> Tensor:
        scores = logits.float().reshape(1, -1)
        scores = repetition_penalty(scores, previous.reshape(1, -1), penalty)
        if previous.numel() < self.min_new_tokens:
            scores = scores.clone()
            scores[:, self.eos_id] = float("-inf")
        return scores.masked_fill(self.suppressed, float("-inf"))
