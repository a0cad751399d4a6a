"""KernelOptions read from the environment (the one place the kernel backend reads it)."""

from __future__ import annotations

import pytest

from wyoming_qwen3tts.backends.kernels.options import KernelOptions


def test_defaults_when_the_environment_says_nothing() -> None:
    opts = KernelOptions.from_env({})
    assert opts == KernelOptions()
    assert opts.blas_rows == 32 and opts.pdl and not opts.gemv_groups


def test_each_variable_overrides_its_option() -> None:
    env = {"Q3T_BLAS_ROWS": "0", "Q3T_PDL": "0", "Q3T_ATTN_SPLITS": "8", "Q3T_GEMV_GROUPS": "1", "Q3T_I8_DEEP": "1"}
    opts = KernelOptions.from_env(env)
    assert (opts.blas_rows, opts.pdl, opts.attn_splits, opts.gemv_groups, opts.i8_deep) == (0, False, 8, True, True)
    assert KernelOptions.from_env({"Q3T_BLAS_ROWS": "64"}).blas_rows == 64


@pytest.mark.parametrize("env", [{"Q3T_BLAS_ROWS": "-1"}, {"Q3T_ATTN_SPLITS": "0"}])
def test_out_of_range_values_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        KernelOptions.from_env(env)
