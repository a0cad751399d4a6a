"""Named tensors handed out to a functional module while it is built, with every missing or misshapen one collected
into one error (so a broken checkpoint is described in full, not one tensor at a time)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ModelLoadError


class NamedWeights:
    """`w(name, shape)` returns tensors[prefix + name] cast to dtype/device and notes problems; `check()` raises them.

    Building goes on with an empty placeholder after a miss, so that one error can list every problem at once.
    """

    def __init__(
        self, tensors: dict[str, Tensor], dtype: torch.dtype, device: torch.device, *, prefix: str, what: str
    ) -> None:
        self.tensors = tensors
        self.dtype = dtype
        self.device = device
        self.prefix = prefix
        self.what = what
        self.missing: list[str] = []
        self.misshapen: list[str] = []

    def __call__(self, name: str, shape: tuple[int, ...] | None = None, *, optional: bool = False) -> Tensor:
        key = self.prefix + name
        t = self.tensors.get(key)
        if t is None:
            if not optional:
                self.missing.append(key)
            return torch.empty(0, dtype=self.dtype, device=self.device)
        if shape is not None and tuple(t.shape) != shape:
            self.misshapen.append(f"{key} is {tuple(t.shape)}, expected {shape}")
        return t.to(device=self.device, dtype=self.dtype)

    def has(self, name: str) -> bool:
        return self.prefix + name in self.tensors

    def check(self) -> None:
        problems: list[str] = []
        if self.missing:
            problems.append(f"{len(self.missing)} missing: " + ", ".join(self.missing))
        if self.misshapen:
            problems.append(f"{len(self.misshapen)} with the wrong shape: " + "; ".join(self.misshapen))
        if problems:
            raise ModelLoadError(f"{self.what} weights do not fit the config: " + " | ".join(problems))
