"""Load the q3t kernel library (built by build.py) and declare its C ABI for ctypes.

Without a GPU or a usable library `load` raises `NativeUnavailable` with a reason a person can
act on, and callers fall back to the torch path.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .build import ABI_VERSION, NativeUnavailable, build, cached_library

__all__ = ["ABI_VERSION", "FUNCTIONS", "Native", "NativeError", "NativeUnavailable", "load"]

# dtype codes and flags of q3t.h
F32 = 0
BF16 = 1
I8 = 2  # GEMV matrices only: int8 rows with a float32 scale each (w_scale)
GEMV_STORE = 0
GEMV_ADD = 1
GEMV_SWIGLU = 2
SAMPLE_DO_SAMPLE = 1
BATCH_MAX = 64  # streams one batched step advances at most

# q3t_sample_params (q3t.h): one slot's sampling settings, as the batched draw reads them from the device.
SAMPLE_PARAMS_DTYPE = np.dtype(
    [
        ("flags", "<i4"),
        ("temperature", "<f4"),
        ("top_k", "<i4"),
        ("top_p", "<f4"),
        ("penalty", "<f4"),
        ("eos", "<i4"),
        ("min_new_tokens", "<i4"),
        ("reserved", "<i4"),
    ]
)

_c_int = ctypes.c_int
_c_float = ctypes.c_float
_p = ctypes.c_void_p

# Every exported function: restype, argtypes. tests/kernels/test_native_build.py checks this table
# against the prototypes in q3t.h, so keep the two in step (and bump ABI_VERSION together).
FUNCTIONS: dict[str, tuple[Any, list[Any]]] = {
    "q3t_abi_version": (_c_int, []),
    "q3t_last_error": (ctypes.c_char_p, []),
    "q3t_init": (_c_int, [_c_int, ctypes.POINTER(_c_int), ctypes.POINTER(_c_int)]),
    "q3t_set_pdl": (_c_int, [_c_int]),
    "q3t_set_gemv_clusters": (_c_int, [_c_int]),
    "q3t_set_gemv_groups": (_c_int, [_c_int]),
    "q3t_set_i8_deep": (_c_int, [_c_int]),
    "q3t_set_i8_mma": (_c_int, [_c_int]),
    "q3t_rmsnorm": (_c_int, [_p, _p, _p, _c_int, _c_float, _p]),
    "q3t_gemv": (_c_int, [_c_int, _p, _p, _c_int, _c_int, _p, _p, _c_float, _p, _p, _c_int, _p]),
    "q3t_gemv_batch": (_c_int, [_c_int, _p, _p, _c_int, _c_int, _p, _c_int, _p, _c_float, _p, _p, _c_int, _p]),
    "q3t_rope_attention": (
        _c_int,
        [_c_int, _p, _p, _p, _c_float, _p, _p, _p, _c_int, _c_int, _c_int, _c_int, _c_int, _c_float, _p, _p, _p, _p],
    ),
    "q3t_rope_attention_split": (
        _c_int,
        [
            _c_int,
            _p,
            _p,
            _p,
            _c_float,
            _p,
            _p,
            _p,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_float,
            _c_int,
            _p,
            _p,
            _p,
            _p,
            _p,
        ],
    ),
    "q3t_rope_attention_first": (
        _c_int,
        [_c_int, _p, _p, _p, _c_float, _p, _p, _c_int, _c_int, _c_int, _c_int, _c_int, _c_float, _p, _p, _p, _p],
    ),
    "q3t_embed_row": (_c_int, [_c_int, _p, _c_int, _c_int, _p, _p, _p]),
    "q3t_embed_sum": (_c_int, [_c_int, _p, _c_int, _c_int, _c_int, _c_int, _p, _p, _c_int, _p, _p, _p, _p]),
    "q3t_sample": (
        _c_int,
        [
            _p,
            _c_int,
            _p,
            _c_float,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_float,
            _c_int,
            _c_float,
            _p,
            _c_int,
            _p,
            _p,
            _c_int,
            _p,
            _c_int,
            _c_int,
            _p,
            _p,
        ],
    ),
    "q3t_cp_passes": (
        _c_int,
        [_c_int, _p, _c_int, _p, _p, _c_int]
        + [_c_int] * 9
        + [_c_float, _c_float]
        + [_p] * 9
        + [_c_int, _c_float, _c_int, _c_float]
        + [_p] * 7,
    ),
    "q3t_store_row": (_c_int, [_p, _c_int, _p, _p, _c_int, _p]),
    "q3t_add_i32": (_c_int, [_p, _c_int, _c_int, _p]),
    # The codec decoder's activation (q3t.h, after the batched step).
    "q3t_snake_beta": (
        _c_int,
        [_c_int, _p, ctypes.c_longlong, ctypes.c_longlong, _p, _p, _p, ctypes.c_longlong, ctypes.c_longlong]
        + [_c_int] * 3
        + [_p],
    ),
    # The batched decode step (q3t.h, last section).
    "q3t_batched_gemv": (
        _c_int,
        [_c_int, _p, _p, _c_int, _c_int, _p, _c_int, _p, _c_float, _p, _p, _c_int, _p, ctypes.c_longlong, _p],
    ),
    "q3t_batched_gemv_scratch_floats": (ctypes.c_longlong, [_c_int, _c_int, _c_int]),
    "q3t_batched_rope_attention_split": (
        _c_int,
        [
            _c_int,
            _p,
            _p,
            _p,
            _c_float,
            _p,
            _p,
            _p,
            _p,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_float,
            _c_int,
            _p,
            _p,
            _p,
            _c_int,
            _p,
            _p,
        ],
    ),
    "q3t_batched_rope_attention": (
        _c_int,
        [
            _c_int,
            _p,
            _p,
            _p,
            _c_float,
            _p,
            _p,
            _p,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_float,
            _p,
            _p,
            _c_int,
            _p,
            _p,
        ],
    ),
    "q3t_batched_rope_attention_first": (
        _c_int,
        [
            _c_int,
            _p,
            _p,
            _p,
            _c_float,
            _p,
            _p,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_int,
            _c_float,
            _p,
            _p,
            _c_int,
            _p,
            _p,
        ],
    ),
    "q3t_batched_sample": (
        _c_int,
        [
            _p,
            _c_int,
            _c_int,
            _p,
            _p,
            _p,
            _p,
            _p,
            _c_int,
            _c_int,
            _c_int,
            _p,
            _c_int,
            _c_int,
            _p,
            _c_int,
            _c_int,
            _p,
            _c_int,
            _p,
        ],
    ),
    "q3t_batched_embed_sum": (
        _c_int,
        [_c_int, _p, _c_int, _c_int, _c_int, _c_int, _p, _c_int, _p, _p, _c_int, _p, _p, _p, _p, _p],
    ),
    "q3t_batched_rmsnorm": (_c_int, [_p, _p, _p, _c_int, _c_int, _c_float, _p]),
    "q3t_batched_rows_bf16": (_c_int, [_p, _p, _c_float, _p, _c_int, _c_int, _p]),
    "q3t_batched_swiglu": (_c_int, [_p, _p, _p, _c_int, _c_int, _p]),
    "q3t_batched_store_codes": (_c_int, [_p, _c_int, _c_int, _p, _p, _p, _c_int, _p]),
    "q3t_batched_advance": (_c_int, [_p, _c_int, _p, _p, _p]),
}


class NativeError(RuntimeError):
    """A q3t call failed; the message carries the CUDA/HIP runtime's own error string."""


class Native:
    """The loaded library: `call(name, *args)` runs one q3t function and raises NativeError on failure."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.lib = ctypes.CDLL(str(path))
        except OSError as err:
            raise NativeUnavailable(f"cannot load {path}: {err}") from None
        for name, (restype, argtypes) in FUNCTIONS.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                raise NativeUnavailable(f"{path} lacks {name}; rebuild it")
            fn.restype = restype
            fn.argtypes = argtypes
        got = self.lib.q3t_abi_version()
        if got != ABI_VERSION:
            raise NativeUnavailable(f"{path} has ABI version {got}, this package needs {ABI_VERSION}; rebuild it")
        self.warp_size = 0
        self.sm_count = 0

    def init(self, device: int) -> None:
        warp, sms = _c_int(0), _c_int(0)
        if self.lib.q3t_init(device, ctypes.byref(warp), ctypes.byref(sms)) != 0:
            raise NativeUnavailable(f"GPU {device} unusable by the kernels: {self.last_error()}")
        self.warp_size, self.sm_count = warp.value, sms.value

    def last_error(self) -> str:
        msg = self.lib.q3t_last_error()
        return msg.decode(errors="replace") if msg else ""

    def call(self, name: str, *args: Any) -> None:
        if getattr(self.lib, name)(*args) != 0:
            raise NativeError(f"{name}: {self.last_error()}")


_lock = threading.Lock()
_loaded: Native | None = None


def load(device: int = 0) -> Native:
    """Build if needed, load, check the ABI and initialise for `device`. Raises NativeUnavailable."""
    global _loaded
    with _lock:
        if _loaded is None:
            try:
                import torch
            except ImportError:
                raise NativeUnavailable("torch is not installed") from None
            if not torch.cuda.is_available():
                raise NativeUnavailable("no GPU visible to torch (torch.cuda.is_available() is False)")
            lib = Native(cached_library() or build())
            lib.init(device)
            _loaded = lib
        return _loaded
