"""Build and cache the q3t kernel library (kernels/).

The same sources build with nvcc (CUDA) or hipcc (ROCm), whichever matches the torch build.
The shared library is cached under a directory keyed by a hash of the sources, the
toolchain, its version, the flags and the target architectures, so a rebuild happens only
when one of those changes. Without a toolchain the build raises `NativeUnavailable` with a
reason a person can act on. Loading the built library and its C ABI live in library.py.

`python -m wyoming_qwen3tts.backends.kernels.build [--arch sm_90,...] [--toolchain nvcc|hipcc]`
builds and prints the library path (what kernels/build.sh and the Dockerfiles run).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Must equal Q3T_ABI_VERSION in kernels/include/q3t.h; part of the cache key, checked by library.py at load.
ABI_VERSION = 14

# The kernel sources: inside the package when installed from a wheel or non-editable (setup.py puts
# them there), else the checkout's kernels/ (editable installs, the Docker images, tests).
_PACKAGED = Path(__file__).resolve().parents[2] / "_kernels"
KERNEL_DIR = _PACKAGED if (_PACKAGED / "src").is_dir() else Path(__file__).resolve().parents[3] / "kernels"
DEFAULT_HIP_ARCHS = ("gfx1201",)
DEFAULT_CUDA_ARCHS = ("sm_90",)


class NativeUnavailable(RuntimeError):
    """The kernel library cannot be used here; str(err) says why (no GPU, no compiler, ...)."""


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
    candidates: list[str | None] = [env_path] if env_path else []
    root = os.environ.get("ROCM_PATH" if kind == "hipcc" else "CUDA_HOME") or (
        "/opt/rocm" if kind == "hipcc" else "/usr/local/cuda"
    )
    candidates += [shutil.which(kind), str(Path(root) / "bin" / kind)]
    path = next((c for c in candidates if c and Path(c).is_file() and os.access(c, os.X_OK)), None)
    if path is None:
        raise NativeUnavailable(
            f"{kind} not found (looked on PATH and in {root}/bin); install "
            + ("ROCm's hipcc" if kind == "hipcc" else "the CUDA toolkit's nvcc")
            + " or set "
            + ("HIPCC" if kind == "hipcc" else "NVCC")
            + " to build the fused kernels"
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
    except Exception:
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
