"""The q3t kernel library for the GPU tests: the `ops` fixture (skips without a build, fails instead with
Q3T_REQUIRE=1; Q3T_PDL=1 launches every op with programmatic dependent launch), seeded generators on the GPU, and
the comparisons of a kernel's result with its reference."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.backends.kernels import build, library
from wyoming_qwen3tts.backends.kernels.ops import Ops

DEV = "cuda"


@pytest.fixture(scope="module")
def ops() -> Ops:
    try:
        lib = library.load(0)
    except build.NativeUnavailable as err:
        if os.environ.get("Q3T_REQUIRE") == "1":
            raise
        pytest.skip(str(err))
    ops = Ops(lib)
    # Q3T_PDL=1: every op test launches with programmatic dependent launch too.
    ops.set_pdl(os.environ.get("Q3T_PDL", "0") == "1")
    return ops


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def gen(seed: int) -> torch.Generator:
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    return g


def assert_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit-for-bit equality (NaN == NaN), with the first mismatch and the largest error when not."""
    g, w = got.detach().cpu(), want.detach().cpu()
    assert g.shape == w.shape, f"{what}: shape {tuple(g.shape)} vs {tuple(w.shape)}"
    same = (g == w) | (g.isnan() & w.isnan()) if g.is_floating_point() else g == w
    if bool(same.all()):
        return
    bad = (~same).nonzero()
    first = tuple(bad[0].tolist())
    diff = (g.double() - w.double()).abs()
    raise AssertionError(
        f"{what}: {bad.shape[0]} of {g.numel()} elements differ; first at {first}: {g[first].item()!r} vs "
        f"{w[first].item()!r}; max abs diff {diff.max().item():.3e}"
    )


def assert_close(got: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    err = rel(got, ref)
    if err <= tol:
        return
    diff = (got.double().cpu() - ref.double().cpu()).abs()
    worst = tuple(np.unravel_index(int(diff.argmax()), tuple(diff.shape)))
    raise AssertionError(
        f"{what}: relative error {err:.3e} > {tol:.0e}; max abs {diff.max().item():.3e} at {worst} "
        f"(got {got.cpu()[worst].item():.6g}, ref {ref.cpu()[worst].item():.6g})"
    )
