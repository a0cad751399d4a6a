"""KernelOptions read from the environment (the one place the kernel backend reads it)."""

from __future__ import annotations

import pytest

from wyoming_qwen3tts.backends.kernels.batched import BUCKETS, attention_splits, bucket_splits, wave_splits
from wyoming_qwen3tts.backends.kernels.options import KernelOptions


def test_defaults_when_the_environment_says_nothing() -> None:
    opts = KernelOptions.from_env({})
    assert opts == KernelOptions()
    assert opts.blas_rows == 32 and opts.pdl and not opts.gemv_groups and opts.batched_attn_splits == 0


def test_each_variable_overrides_its_option() -> None:
    env = {
        "Q3T_BLAS_ROWS": "0",
        "Q3T_PDL": "0",
        "Q3T_ATTN_SPLITS": "8",
        "Q3T_GEMV_GROUPS": "1",
        "Q3T_I8_DEEP": "1",
        "Q3T_I8_MMA": "1",
    }
    opts = KernelOptions.from_env(env)
    assert (opts.blas_rows, opts.pdl, opts.attn_splits, opts.gemv_groups, opts.i8_deep, opts.i8_mma) == (
        0,
        False,
        8,
        True,
        True,
        True,
    )
    assert KernelOptions.from_env({"Q3T_BLAS_ROWS": "64"}).blas_rows == 64
    assert KernelOptions.from_env({"Q3T_BATCHED_ATTN_SPLITS": "4"}).batched_attn_splits == 4
    assert KernelOptions.from_env({"Q3T_STEPS_AHEAD": "4"}).steps_ahead == 4
    assert KernelOptions.from_env({"Q3T_ADMIT_GATHER_MS": "7.5"}).admit_gather_ms == 7.5
    assert KernelOptions().fused_codec and not KernelOptions.from_env({"Q3T_FUSED_CODEC": "0"}).fused_codec
    assert KernelOptions.from_env({"Q3T_CODEC_GEMM_CONVS": "768"}).codec_gemm_convs == 768
    assert (
        KernelOptions().codec_conv_timed and not KernelOptions.from_env({"Q3T_CODEC_CONV_TIMED": "0"}).codec_conv_timed
    )


@pytest.mark.parametrize(
    "env",
    [
        {"Q3T_BLAS_ROWS": "-1"},
        {"Q3T_ATTN_SPLITS": "0"},
        {"Q3T_BATCHED_ATTN_SPLITS": "-1"},
        {"Q3T_STEPS_AHEAD": "0"},
        {"Q3T_ADMIT_GATHER_MS": "-1"},
        {"Q3T_CODEC_GEMM_CONVS": "-1"},
    ],
)
def test_out_of_range_values_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        KernelOptions.from_env(env)


@pytest.mark.parametrize("nb, expected", [(64, 1), (32, 2), (16, 4), (8, 8), (1, 66)])
def test_wave_splits_fill_one_wave_of_the_grouped_attention(nb: int, expected: int) -> None:
    """A 132-SM GPU (H100, H200) holds 4 blocks of the grouped kernel an SM: 528 blocks of 8 KV heads x chunks x
    streams; a 64-slot decoder takes the fewer of that and its own 4."""
    assert wave_splits(nb, kv_heads=8, sms=132) == expected
    assert min(attention_splits(64), wave_splits(nb, 8, 132)) == min(4, expected)


def test_wave_splits_never_drop_below_one_chunk() -> None:
    assert wave_splits(64, kv_heads=8, sms=8) == 1


def test_bucket_splits_per_bucket_only_where_allowed() -> None:
    """A 64-slot decoder on a 132-SM GPU: 1 chunk a head at 64 streams, 2 at 32, its own 4 below; the same 4 at
    every bucket under batch invariance or a pinned count (per_bucket False), or where the SM count is unknown."""
    adaptive = bucket_splits(attention_splits(64), kv_heads=8, sms=132, per_bucket=True)
    assert adaptive == {1: 4, 2: 4, 4: 4, 8: 4, 16: 4, 32: 2, 64: 1}
    assert bucket_splits(4, 8, 132, per_bucket=False) == dict.fromkeys(BUCKETS, 4)
    assert bucket_splits(4, 8, 0, per_bucket=True) == dict.fromkeys(BUCKETS, 4)
