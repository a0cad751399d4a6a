"""Build, cache and load the q3t kernel library (kernels/), and declare its C ABI for ctypes.

The same sources build with nvcc (CUDA) or hipcc (ROCm), whichever matches the torch build.
The shared library is cached under a directory keyed by a hash of the sources, the
toolchain, its version, the flags and the target architectures, so a rebuild happens only
when one of those changes. Without a toolchain or a GPU the loader raises
`NativeUnavailable` with a reason a person can act on, and callers fall back to the torch path.

`python -m wyoming_qwen3tts.native [--arch sm_90,...] [--toolchain nvcc|hipcc]` builds and
prints the library path (what kernels/build.sh runs).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ABI_VERSION = 9  # must equal Q3T_ABI_VERSION in kernels/include/q3t.h

# The kernel sources: inside the package when installed from a wheel or non-editable (setup.py puts
# them there), else the checkout's kernels/ (editable installs, the Docker images, tests).
_PACKAGED = Path(__file__).resolve().parent / "_kernels"
KERNEL_DIR = _PACKAGED if (_PACKAGED / "src").is_dir() else Path(__file__).resolve().parent.parent / "kernels"
DEFAULT_HIP_ARCHS = ("gfx1201",)
DEFAULT_CUDA_ARCHS = ("sm_90",)

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
            _c_int, _p, _p, _p, _c_float, _p, _p, _p, _c_int, _c_int, _c_int, _c_int, _c_int, _c_float, _c_int, _p,
            _p, _p, _p, _p,
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
            _p, _c_int, _p, _c_float, _c_int, _c_int, _c_int, _c_int, _c_int, _c_float, _c_int, _c_float,
            _p, _c_int, _p, _p, _c_int, _p, _c_int, _c_int, _p, _p,
        ],
    ),
    "q3t_store_row": (_c_int, [_p, _c_int, _p, _p, _c_int, _p]),
    "q3t_add_i32": (_c_int, [_p, _c_int, _c_int, _p]),
    # The batched decode step (q3t.h, last section).
    "q3t_batched_gemv": (
        _c_int,
        [_c_int, _p, _p, _c_int, _c_int, _p, _c_int, _p, _c_float, _p, _p, _c_int, _p, ctypes.c_longlong, _p],
    ),
    "q3t_batched_gemv_scratch_floats": (ctypes.c_longlong, [_c_int, _c_int, _c_int]),
    "q3t_batched_rope_attention_split": (
        _c_int,
        [
            _c_int, _p, _p, _p, _c_float, _p, _p, _p, _p, _c_int, _c_int, _c_int, _c_int, _c_int, _c_float, _c_int,
            _p, _p, _p, _c_int, _p, _p,
        ],
    ),
    "q3t_batched_rope_attention": (
        _c_int,
        [
            _c_int, _p, _p, _p, _c_float, _p, _p, _p, _c_int, _c_int, _c_int, _c_int, _c_int, _c_int, _c_float, _p,
            _p, _c_int, _p, _p,
        ],
    ),
    "q3t_batched_rope_attention_first": (
        _c_int,
        [
            _c_int, _p, _p, _p, _c_float, _p, _p, _c_int, _c_int, _c_int, _c_int, _c_int, _c_int, _c_float, _p, _p,
            _c_int, _p, _p,
        ],
    ),
    "q3t_batched_sample": (
        _c_int,
        [
            _p, _c_int, _c_int, _p, _p, _p, _p, _p, _c_int, _c_int, _c_int, _p, _c_int, _c_int, _p, _c_int, _c_int,
            _p, _c_int, _p,
        ],
    ),
    "q3t_batched_embed_sum": (
        _c_int,
        [_c_int, _p, _c_int, _c_int, _c_int, _c_int, _p, _c_int, _p, _p, _c_int, _p, _p, _p, _p, _p],
    ),
    "q3t_batched_rmsnorm": (_c_int, [_p, _p, _p, _c_int, _c_int, _c_float, _p]),
    "q3t_batched_store_codes": (_c_int, [_p, _c_int, _c_int, _p, _p, _p, _c_int, _p]),
    "q3t_batched_advance": (_c_int, [_p, _c_int, _p, _p, _p]),
}


class NativeUnavailable(RuntimeError):
    """The kernel library cannot be used here; str(err) says why (no GPU, no compiler, ...)."""


class NativeError(RuntimeError):
    """A q3t call failed; the message carries the CUDA/HIP runtime's own error string."""


@dataclass(frozen=True)
class Toolchain:
    kind: str  # "nvcc" or "hipcc"
    path: str
    version: str
    archs: tuple[str, ...]


def sources() -> list[Path]:
    return sorted((KERNEL_DIR / "src").glob("*.cu"))


def _headers() -> list[Path]:
    """Every header the sources include (.h and .cuh): part of the library's cache key."""
    src = [f for f in (KERNEL_DIR / "src").iterdir() if f.suffix in (".h", ".cuh")]
    return sorted(src) + sorted((KERNEL_DIR / "include").glob("*.h"))


def _split_archs(value: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in value.replace(";", ",").split(",") if a.strip())


def find_toolchain(kind: str | None = None, archs: tuple[str, ...] | None = None) -> Toolchain:
    """nvcc for CUDA torch builds, hipcc for ROCm ones; Q3T_TOOLCHAIN / Q3T_ARCHS override."""
    kind = kind or os.environ.get("Q3T_TOOLCHAIN") or _torch_vendor()
    if kind not in ("nvcc", "hipcc"):
        raise NativeUnavailable(f"unknown kernel toolchain {kind!r} (use nvcc or hipcc)")
    env_path = os.environ.get("HIPCC" if kind == "hipcc" else "NVCC")
    candidates = [env_path] if env_path else []
    root = os.environ.get("ROCM_PATH" if kind == "hipcc" else "CUDA_HOME") or ("/opt/rocm" if kind == "hipcc" else "/usr/local/cuda")
    candidates += [shutil.which(kind), str(Path(root) / "bin" / kind)]
    path = next((c for c in candidates if c and Path(c).is_file() and os.access(c, os.X_OK)), None)
    if path is None:
        raise NativeUnavailable(
            f"{kind} not found (looked on PATH and in {root}/bin); install "
            + ("ROCm's hipcc" if kind == "hipcc" else "the CUDA toolkit's nvcc")
            + " or set " + ("HIPCC" if kind == "hipcc" else "NVCC") + " to build the fused kernels"
        )
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, env=_build_env(kind))
        version = (out.stdout + out.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        raise NativeUnavailable(f"{path} --version failed: {err}") from None
    if archs is None:
        env_archs = os.environ.get("Q3T_ARCHS")
        archs = _split_archs(env_archs) if env_archs else _detect_archs(kind)
    return Toolchain(kind=kind, path=path, version=version, archs=archs)


def _torch_vendor() -> str:
    try:
        import torch
    except ImportError:
        return "nvcc"
    return "hipcc" if getattr(torch.version, "hip", None) else "nvcc"


def _detect_archs(kind: str) -> tuple[str, ...]:
    """The archs of the visible GPUs, else the defaults (gfx1201 / sm_90)."""
    try:
        import torch

        if torch.cuda.is_available():
            found: list[str] = []
            for i in range(torch.cuda.device_count()):
                if kind == "hipcc":
                    name = getattr(torch.cuda.get_device_properties(i), "gcnArchName", "") or ""
                    arch = name.split(":")[0]
                else:
                    major, minor = torch.cuda.get_device_capability(i)
                    arch = f"sm_{major}{minor}"
                if arch and arch not in found:
                    found.append(arch)
            if found:
                return tuple(found)
    except Exception:  # noqa: BLE001 - detection is best effort; the defaults still build
        pass
    return DEFAULT_HIP_ARCHS if kind == "hipcc" else DEFAULT_CUDA_ARCHS


def _build_env(kind: str) -> dict[str, str]:
    env = dict(os.environ)
    if kind == "hipcc":
        # hipcc picks the NVIDIA platform when it sees nvcc; we always mean AMD.
        env["HIP_PLATFORM"] = "amd"
    return env


def compile_command(tc: Toolchain, out: Path, *, werror: bool = False) -> list[str]:
    srcs = [str(s) for s in sources()]
    inc = f"-I{KERNEL_DIR / 'include'}"
    if tc.kind == "nvcc":
        cmd = [tc.path, "-O3", "-std=c++17", inc, "-Xcompiler", "-fPIC,-fvisibility=hidden", "-lineinfo"]
        for a in tc.archs:
            cc = a.removeprefix("sm_").removeprefix("compute_")
            cmd += ["-gencode", f"arch=compute_{cc},code=sm_{cc}"]
        if werror:
            cmd += ["-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror"]
    else:
        cmd = [tc.path, "-x", "hip", "-O3", "-std=c++17", inc, "-fPIC", "-fvisibility=hidden"]
        cmd += [f"--offload-arch={a}" for a in tc.archs]
        if werror:
            cmd += ["-Wall", "-Wextra", "-Werror"]
    return cmd + ["-shared", "-o", str(out)] + srcs


def cache_key(tc: Toolchain) -> str:
    """Hash of the sources, headers, toolchain kind, archs, flags and ABI version.

    The compiler's path and version and the sources' location are left out on purpose: a runtime
    image that ships a prebuilt library but no compiler must still find it (see `cached_library`),
    and a checkout and an installed wheel of the same sources share one library."""
    h = hashlib.sha256()
    for f in [*sources(), *_headers()]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    flags = compile_command(Toolchain(tc.kind, tc.kind, "", tc.archs), Path("x"))[1 : -len(sources())]
    flags = [f.replace(str(KERNEL_DIR), "kernels") for f in flags]  # where the sources sit is no part of it
    h.update(repr((tc.kind, tc.archs, ABI_VERSION, flags)).encode())
    return h.hexdigest()[:20]


def cache_dir() -> Path:
    env = os.environ.get("Q3T_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wyoming-qwen3tts" / "kernels"


def library_path(tc: Toolchain) -> Path:
    return cache_dir() / f"libq3t-{tc.kind}-{'-'.join(tc.archs)}-{cache_key(tc)}.so"


def cached_library(kind: str | None = None, archs: tuple[str, ...] | None = None) -> Path | None:
    """The already-built library for these sources, if any; needs no compiler."""
    kind = kind or os.environ.get("Q3T_TOOLCHAIN") or _torch_vendor()
    if archs is None:
        env_archs = os.environ.get("Q3T_ARCHS")
        archs = _split_archs(env_archs) if env_archs else _detect_archs(kind)
    path = library_path(Toolchain(kind, kind, "", archs))
    return path if path.exists() else None


def build(tc: Toolchain | None = None, *, force: bool = False, werror: bool = False) -> Path:
    """Compile the library (or reuse the cached one); returns its path."""
    tc = tc or find_toolchain()
    if not sources():
        raise NativeUnavailable(f"kernel sources not found under {KERNEL_DIR}")
    target = library_path(tc)
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = compile_command(tc, out, werror=werror)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_build_env(tc.kind), cwd=tmp)
        if proc.returncode != 0:
            raise NativeUnavailable(
                f"building the kernels with {tc.kind} failed (exit {proc.returncode}):\n{' '.join(cmd)}\n"
                + (proc.stderr or proc.stdout)[-4000:]
            )
        os.replace(out, target)  # atomic: concurrent builders never see a half-written library
    return target


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


def availability(device: int = 0) -> tuple[bool, str]:
    """(True, library path) or (False, the reason the torch path is used instead)."""
    try:
        return True, str(load(device).path)
    except NativeUnavailable as err:
        return False, str(err)


def header_prototypes(header: Path | None = None) -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, [parameter types]) parsed from q3t.h's Q3T_API lines."""
    text = (header or KERNEL_DIR / "include" / "q3t.h").read_text()
    out: dict[str, tuple[str, list[str]]] = {}
    for m in re.finditer(r"^Q3T_API\s+(.+?)\s*\b(q3t_\w+)\s*\((.*?)\);", text, re.M | re.S):
        ret, name, params = m.group(1).strip(), m.group(2), m.group(3).strip()
        types: list[str] = []
        if params and params != "void":
            for p in params.split(","):
                p = " ".join(p.split())
                pm = re.match(r"(.*?)(\w+)$", p)
                types.append((pm.group(1) if pm else p).replace(" *", "*").strip())
        out[name] = (ret, types)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="build the q3t kernel library")
    ap.add_argument("--toolchain", choices=("nvcc", "hipcc"))
    ap.add_argument("--arch", help="comma-separated, e.g. gfx1201,gfx1100 or sm_90,sm_89")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--werror", action="store_true")
    a = ap.parse_args(argv)
    try:
        tc = find_toolchain(a.toolchain, _split_archs(a.arch) if a.arch else None)
        print(build(tc, force=a.force, werror=a.werror))
    except NativeUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
