"""The kernel library builds warning-free with nvcc (sm_90) and, where hipcc is installed, for
gfx1030 (RDNA2, wave32) and gfx90a (CDNA, wave64); and library.py's ctypes table matches
kernels/include/q3t.h. No GPU needed."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from wyoming_qwen3tts.backends.kernels import build, library

C_TO_CTYPES = {
    "int": ctypes.c_int,
    "float": ctypes.c_float,
    "unsigned long long": ctypes.c_ulonglong,
    "long long": ctypes.c_longlong,
    "const char*": ctypes.c_char_p,
    "int*": ctypes.POINTER(ctypes.c_int),
}


def header_prototypes(header: Path | None = None) -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, [parameter types]) parsed from q3t.h's Q3T_API lines."""
    text = (header or build.KERNEL_DIR / "include" / "q3t.h").read_text()
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


def _ctype_for(c: str) -> object:
    c = c.strip()
    if c in C_TO_CTYPES:
        return C_TO_CTYPES[c]
    if c.endswith("*"):
        return ctypes.c_void_p  # device pointers and the stream travel as void*
    raise AssertionError(f"no ctypes mapping for C type {c!r}")


def test_header_and_ctypes_table_agree() -> None:
    protos = header_prototypes()
    assert set(protos) == set(library.FUNCTIONS), (
        f"only in q3t.h: {sorted(set(protos) - set(library.FUNCTIONS))}; "
        f"only in library.py: {sorted(set(library.FUNCTIONS) - set(protos))}"
    )
    for name, (ret, params) in protos.items():
        restype, argtypes = library.FUNCTIONS[name]
        assert restype is _ctype_for(ret), f"{name}: return {ret} vs {restype}"
        assert len(argtypes) == len(params), f"{name}: {len(params)} C parameters, {len(argtypes)} ctypes"
        for i, (c, py) in enumerate(zip(params, argtypes)):
            want = _ctype_for(c)
            # int* out-parameters of host memory are declared as POINTER(c_int); device int* as void*
            if c == "int*" and py is ctypes.c_void_p:
                continue
            assert py is want or (c == "int*" and py == want), f"{name} arg {i}: C {c!r} vs ctypes {py}"


def test_abi_version_matches_header() -> None:
    text = (build.KERNEL_DIR / "include" / "q3t.h").read_text()
    m = re.search(r"#define\s+Q3T_ABI_VERSION\s+(\d+)", text)
    assert m and int(m.group(1)) == build.ABI_VERSION


def test_constants_match_header() -> None:
    text = (build.KERNEL_DIR / "include" / "q3t.h").read_text()
    for name, value in {
        "Q3T_F32": library.F32,
        "Q3T_BF16": library.BF16,
        "Q3T_I8": library.I8,
        "Q3T_GEMV_STORE": library.GEMV_STORE,
        "Q3T_GEMV_ADD": library.GEMV_ADD,
        "Q3T_GEMV_SWIGLU": library.GEMV_SWIGLU,
        "Q3T_SAMPLE_DO_SAMPLE": library.SAMPLE_DO_SAMPLE,
        "Q3T_BATCH_MAX": library.BATCH_MAX,
    }.items():
        m = re.search(rf"#define\s+{name}\s+(\d+)", text)
        assert m and int(m.group(1)) == value, name


def test_sample_params_record_matches_header() -> None:
    """library.SAMPLE_PARAMS_DTYPE has q3t_sample_params' fields, in order, with their C types (all
    4 bytes, so the C layout has no padding): the batched draw reads the records the backend writes."""
    text = (build.KERNEL_DIR / "include" / "q3t.h").read_text()
    m = re.search(r"typedef struct q3t_sample_params \{(.*?)\} q3t_sample_params;", text, re.S)
    assert m
    fields = re.findall(r"^\s*(int|float)\s+(\w+);", m.group(1), re.M)
    dt = library.SAMPLE_PARAMS_DTYPE
    assert [name for _, name in fields] == list(dt.names)
    for ctype, name in fields:
        assert dt[name] == (np.dtype("<i4") if ctype == "int" else np.dtype("<f4")), name
    assert dt.itemsize == 4 * len(fields) == 32


def _exported(lib: Path) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not installed")
    import subprocess

    out = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if " T " in line}


def _build(kind: str, archs: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("Q3T_CACHE_DIR", str(tmp_path))
    try:
        tc = build.find_toolchain(kind, archs)
    except build.NativeUnavailable as err:
        # CI installs both compilers and sets Q3T_REQUIRE_TOOLCHAINS=1: there a missing one fails.
        if os.environ.get("Q3T_REQUIRE_TOOLCHAINS") == "1":
            pytest.fail(f"{kind} toolchain required on CI: {err}")
        pytest.skip(str(err))
    lib = build.build(tc, werror=True)
    assert lib.exists() and lib.parent == tmp_path
    # Only the ABI is exported (kernels and helpers stay hidden).
    exported = {s for s in _exported(lib) if s.startswith("q3t_")}
    assert exported == set(library.FUNCTIONS)
    # The cache is hit on the second call: same path, not rebuilt.
    mtime = lib.stat().st_mtime_ns
    assert build.build(tc) == lib and lib.stat().st_mtime_ns == mtime
    return lib


@pytest.mark.slow
def test_builds_with_nvcc_sm90(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _build("nvcc", ("sm_90",), tmp_path, monkeypatch)


def _sass_tools() -> tuple[str, str] | None:
    """cuobjdump and the nvdisasm it calls (the device machine has both; CI does not)."""
    cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    nvdisasm = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    # The test extra installs NVIDIA's nvidia-cuda-cuobjdump / -nvdisasm wheels (bin/ under nvidia/cu13).
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    wheel_dirs = [str(Path(p) / "cu13") for p in (spec.submodule_search_locations or [])] if spec else []
    for d in (os.environ.get("CUDA_HOME") or "/usr/local/cuda", *wheel_dirs):
        cuobjdump = cuobjdump or (
            str(Path(d) / "bin" / "cuobjdump") if (Path(d) / "bin" / "cuobjdump").exists() else None
        )
        nvdisasm = nvdisasm or (str(Path(d) / "bin" / "nvdisasm") if (Path(d) / "bin" / "nvdisasm").exists() else None)
    return (cuobjdump, nvdisasm) if cuobjdump and nvdisasm else None


def _sass_functions(lib: Path, tools: tuple[str, str]) -> dict[str, list[str]]:
    import subprocess

    cuobjdump, nvdisasm = tools
    env = dict(os.environ, PATH=f"{Path(nvdisasm).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    out = subprocess.run(
        [cuobjdump, "--dump-sass", str(lib)], capture_output=True, text=True, check=True, env=env
    ).stdout
    funcs: dict[str, list[str]] = {}
    for m in re.finditer(r"Function : (\S+)(.*?)(?=Function : |\Z)", out, re.S):
        funcs[m.group(1)] = [ln for ln in m.group(2).splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", ln)]
    return funcs


@pytest.mark.slow
def test_gemv_sass_loads_weights_before_the_grid_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the sm_90 SASS of every vectorised GEMV kernel, its up-front 16-byte weight loads
    (LDG.E.128; v2: PRE, v1: 8) come before ACQBULK (griddepcontrol.wait), so with programmatic
    dependent launch they overlap the previous kernel; PREEXIT (griddepcontrol.launch_dependents)
    comes after the wait in the GEMVs and before it in the other kernels (common.cuh says why).
    ptxas hoists the wait above loads of the same basic block (v1 showed 0 loads before it until
    it too put the wait behind a branch, as v2 does).
    Needs cuobjdump and nvdisasm (the device machine has them; Q3T_REQUIRE_SASS=1 fails without)."""
    tools = _sass_tools()
    if tools is None:
        if os.environ.get("Q3T_REQUIRE_SASS") == "1":
            pytest.fail("cuobjdump/nvdisasm not found (set CUOBJDUMP and NVDISASM)")
        pytest.skip("cuobjdump/nvdisasm not installed")
    lib = _build("nvcc", ("sm_90",), tmp_path, monkeypatch)
    funcs = _sass_functions(lib, tools)
    checked = 0
    for name, lines in funcs.items():
        m = re.search(r"k_gemv(2|2x2)?I([tfa])Li(\d)ELb1E(?:Li(\d+)E)?", name)  # f32, bf16 bits, int8
        if not m:
            continue
        loads = [i for i, ln in enumerate(lines) if "LDG.E.128" in ln]
        wait = next((i for i, ln in enumerate(lines) if re.search(r"\bACQBULK\b", ln)), None)
        assert loads, f"{name}: no 16-byte weight loads (LDG.E.128)"
        assert wait is not None, f"{name}: no griddepcontrol.wait (ACQBULK)"
        before = sum(i < wait for i in loads)
        print(f"{m.group(1) or 'v1'} {m.group(0)}: {before} of {len(loads)} LDG.E.128 before ACQBULK")
        want = int(m.group(4)) if m.group(1) else 8  # exactly the up-front loads go out before the wait
        assert before == want, f"{name}: {before} LDG.E.128 before ACQBULK, want {want}"
        trigger = next((i for i, ln in enumerate(lines) if re.search(r"\bPREEXIT\b", ln)), None)
        assert trigger is not None and trigger > wait, f"{name}: PREEXIT (launch_dependents) not after ACQBULK"
        checked += 1
        # no local memory (spills or run-time-indexed arrays) in any GEMV kernel
        assert not any(re.search(r"\b(LDL|STL)\b", ln) for ln in lines), f"{name}: local memory"
    want = 3 * 3 * (3 * 2 + 1)  # dtypes x modes x (PRE choices x one or two input vectors, + v1)
    assert checked == want, f"checked {checked} vectorised GEMV kernels, expected {want}"
    # The int8 tensor-core GEMV (gemv_i8_mma.cu): its PRE up-front weight loads go out before the wait, it triggers
    # after it, it runs two MMAs (IMMA) per chunk, and it has no local memory; 18 kernels (modes x PRE 2, 4, 8 x
    # one or two vectors).
    i8mma = {n: re.search(r"k_gemv_i8mmaILi(\d)ELi(\d)ELi(\d)E", n) for n in funcs if "k_gemv_i8mma" in n}
    assert len(i8mma) == 18 and all(i8mma.values()), sorted(i8mma)
    for name, m in i8mma.items():
        lines = funcs[name]
        wait = next(i for i, ln in enumerate(lines) if re.search(r"\bACQBULK\b", ln))
        trigger = next(i for i, ln in enumerate(lines) if re.search(r"\bPREEXIT\b", ln))
        before = sum(i < wait for i, ln in enumerate(lines) if "LDG.E.128" in ln)
        assert before == int(m.group(2)), f"{name}: {before} LDG.E.128 before ACQBULK, want {m.group(2)}"
        assert trigger > wait, f"{name}: PREEXIT (launch_dependents) not after ACQBULK"
        assert sum("IMMA" in ln for ln in lines) >= 2 * int(m.group(2)), f"{name}: fewer IMMAs than its chunks"
        assert not any(re.search(r"\b(LDL|STL)\b", ln) for ln in lines), f"{name}: local memory"
    # The batched GEMV (gemv_batched.cu): its ring of 8 loads per lane goes out before the wait, it
    # triggers after it, and it has no local memory; 96 kernels (3 dtypes x 32: modes x nb buckets x rows per warp).
    batched = [n for n in funcs if "k_bgemv" in n and "k_bgemv_mma" not in n]
    assert len(batched) == 96, len(batched)
    for name in batched:
        lines = funcs[name]
        wait = next(i for i, ln in enumerate(lines) if re.search(r"\bACQBULK\b", ln))
        trigger = next(i for i, ln in enumerate(lines) if re.search(r"\bPREEXIT\b", ln))
        before = sum(i < wait for i, ln in enumerate(lines) if "LDG.E.128" in ln)
        assert before == 8, f"{name}: {before} LDG.E.128 before ACQBULK, want 8"
        assert trigger > wait, f"{name}: PREEXIT (launch_dependents) not after ACQBULK"
        assert not any(re.search(r"\b(LDL|STL)\b", ln) for ln in lines), f"{name}: local memory"
    # The tensor-core batched GEMV (gemv_batched_mma.cu): all 2 C weight loads of a lane before the
    # wait, 4 MMAs per column tile and 8 k of a load (bf16: 4 C, int8: 8 C), no local memory; 108 kernels
    # (bf16, int8 x modes x C in 2, 4, 8 (bf16) or 1, 2, 4 (int8) x column tiles x split K in scratch or in a
    # cluster, and the two-tile ones again for more than 16 vectors: 36 whose loop over groups of 16 holds the same
    # code once); the cluster ones pass two cluster barriers (their records written, then read), the others none.
    mma = {
        n: re.search(r"k_bgemv_mmaI([ta])Li(\d)ELi(\d)ELi(\d)ELb([01])ELb([01])E", n)
        for n in funcs
        if "k_bgemv_mma" in n
    }
    assert len(mma) == 108 and all(mma.values()), len(mma)
    assert {m.group(1) for m in mma.values()} == {"t", "a"}
    assert sorted(m.group(5) for m in mma.values()) == ["0"] * 54 + ["1"] * 54
    assert sum(m.group(6) == "1" for m in mma.values()) == 36
    assert all(m.group(4) == "2" for m in mma.values() if m.group(6) == "1")
    for name, m in mma.items():
        barriers = 2 if m.group(5) == "1" else 0
        for op in ("UCGABAR_ARV", "UCGABAR_WAIT"):
            assert sum(op in ln for ln in funcs[name]) == barriers, f"{name}: {op} count"
    for name, m in mma.items():
        lines, c, nt = funcs[name], int(m.group(3)), int(m.group(4))
        loads_k = 16 if m.group(1) == "a" else 8  # k per 16-byte load: int8, bf16
        wait = next(i for i, ln in enumerate(lines) if re.search(r"\bACQBULK\b", ln))
        trigger = next(i for i, ln in enumerate(lines) if re.search(r"\bPREEXIT\b", ln))
        before = sum(i < wait for i, ln in enumerate(lines) if "LDG.E.128" in ln)
        # The weights' 2 C loads; ptxas may hoist the RMSNorm weights' load too (constant, like the matrix).
        assert before in (2 * c, 2 * c + 1), f"{name}: {before} LDG.E.128 before ACQBULK, want {2 * c}"
        early = [ln for i, ln in enumerate(lines[:wait]) if "LDG" in ln and "CONSTANT" not in ln]
        assert not early, f"{name}: a load of what the previous kernel writes before ACQBULK: {early}"
        assert trigger > wait, f"{name}: PREEXIT (launch_dependents) not after ACQBULK"
        assert sum("HMMA" in ln for ln in lines) == 4 * c * nt * loads_k // 8, f"{name}: MMA count"
        assert not any(re.search(r"\b(LDL|STL)\b", ln) for ln in lines), f"{name}: local memory"
    # Every other kernel of the frame lets its successor launch first (common.cuh).
    others = [
        n
        for n in funcs
        if re.search(r"k_sample|k_rope_attention|k_rope_attn_partial|k_attn_merge|k_embed_|k_batched_", n)
    ]
    assert len(others) >= 6, others
    for name in others:
        lines = funcs[name]
        wait = next(i for i, ln in enumerate(lines) if re.search(r"\bACQBULK\b", ln))
        trigger = next(i for i, ln in enumerate(lines) if re.search(r"\bPREEXIT\b", ln))
        assert trigger < wait, f"{name}: PREEXIT (launch_dependents) not before ACQBULK"


@pytest.mark.slow
def test_builds_with_hipcc_wave32_and_wave64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # gfx1030 is the newest target Debian's ROCm 5.2 hipcc knows; gfx90a exercises wave64.
    _build("hipcc", ("gfx1030", "gfx90a"), tmp_path, monkeypatch)


def test_cache_key_covers_every_kernel_source_and_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Editing any file under kernels/ that the build reads (a .cu, a .cuh device header such as
    sample_block.cuh, vendor.h, q3t.h) gives a new cache key, so a stale library is never loaded."""
    import shutil

    kernels = tmp_path / "kernels"
    shutil.copytree(build.KERNEL_DIR / "src", kernels / "src")
    shutil.copytree(build.KERNEL_DIR / "include", kernels / "include")
    monkeypatch.setattr(build, "KERNEL_DIR", kernels)
    tc = build.Toolchain("nvcc", "/x/nvcc", "v1", ("sm_90",))
    files = sorted(p for p in kernels.rglob("*") if p.is_file())
    assert {p.suffix for p in files} == {".cu", ".cuh", ".h"}
    assert set(files) == set(build.sources()) | set(build._headers())
    key = build.cache_key(tc)
    for f in files:
        text = f.read_bytes()
        f.write_bytes(text + b"\n// edited\n")
        assert build.cache_key(tc) != key, f.name
        f.write_bytes(text)
    assert build.cache_key(tc) == key


def test_cache_key_changes_with_arch_and_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = build.Toolchain("nvcc", "/x/nvcc", "v1", ("sm_90",))
    b = build.Toolchain("nvcc", "/x/nvcc", "v1", ("sm_89",))
    assert build.cache_key(a) != build.cache_key(b)
    assert build.cache_key(a) == build.cache_key(a)
    # A prebuilt library is found without any compiler (runtime images ship no nvcc/hipcc).
    monkeypatch.setenv("Q3T_CACHE_DIR", str(tmp_path))
    assert build.cached_library("nvcc", ("sm_90",)) is None
    lib = build.library_path(a)
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(b"")
    c = build.Toolchain("nvcc", "/other/nvcc", "v2", ("sm_90",))
    assert build.cached_library("nvcc", ("sm_90",)) == lib == build.library_path(c)


def test_missing_toolchain_gives_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("NVCC", "/nonexistent/nvcc")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    with pytest.raises(build.NativeUnavailable, match="nvcc not found"):
        build.find_toolchain("nvcc", ("sm_90",))


def test_availability_without_gpu_is_a_reason_not_a_crash() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(library.NativeUnavailable, match="GPU"):
        library.load()
