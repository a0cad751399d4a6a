"""kernels/amd_gate.py, the AMD build gate: its parsers on captured compiler output (clang 21 from
Debian sid's hipcc 7, clang 15 from bookworm's ROCm 5.2), its rules, and the gate itself failing on
purpose when a kernel with a scratch array or register spills is built with the real toolchain.
No GPU needed."""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest

from wyoming_qwen3tts.backends.kernels import build

_spec = importlib.util.spec_from_file_location("amd_gate", build.KERNEL_DIR / "amd_gate.py")
assert _spec and _spec.loader
amd_gate = importlib.util.module_from_spec(_spec)
sys.modules["amd_gate"] = amd_gate  # dataclasses look their module up there
_spec.loader.exec_module(amd_gate)

# hipcc 7.0.2 (clang 21.1.8), --offload-arch=gfx1201 -Rpass-analysis=kernel-resource-usage, trimmed.
CLANG21 = """\
/q3t/kernels/src/gemv_v2.cu:271:1: remark: Function Name: _ZN12_GLOBAL__N_17k_gemv2ItLi2ELb1ELi8EEEvPKT_iiiPKfS5_fS5_Pf [-Rpass-analysis=kernel-resource-usage]
  271 |             const float* __restrict__ norm_w, float eps, const float* __restrict__ bias, float* __restrict__ y) {
      | ^
/q3t/kernels/src/gemv_v2.cu:271:1: remark:     TotalSGPRs: 41 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/gemv_v2.cu:271:1: remark:     VGPRs: 101 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/gemv_v2.cu:271:1: remark:     ScratchSize [bytes/lane]: 144 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/gemv_v2.cu:271:1: remark:     Dynamic Stack: False [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/gemv_v2.cu:271:1: remark:     Occupancy [waves/SIMD]: 12 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/gemv_v2.cu:271:1: remark:     SGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/gemv_v2.cu:271:1: remark:     VGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/gemv_v2.cu:271:1: remark:     LDS Size [bytes/block]: 384 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/code_predictor.cu:241:1: remark: Function Name: _ZN12_GLOBAL__N_116k_code_predictorItEEvNS_6ParamsE [-Rpass-analysis=kernel-resource-usage]
  241 | __global__ void __launch_bounds__(kThreads) k_code_predictor(Params p) {
      | ^
/q3t/kernels/src/code_predictor.cu:241:1: remark:     TotalSGPRs: 107 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/code_predictor.cu:241:1: remark:     VGPRs: 195 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/code_predictor.cu:241:1: remark:     ScratchSize [bytes/lane]: 0 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/code_predictor.cu:241:1: remark:     Dynamic Stack: False [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/code_predictor.cu:241:1: remark:     Occupancy [waves/SIMD]: 7 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/code_predictor.cu:241:1: remark:     SGPRs Spill: 118 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/code_predictor.cu:241:1: remark:     VGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/code_predictor.cu:241:1: remark:     LDS Size [bytes/block]: 5024 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/sampling.cu:9:1: remark: Function Name: _ZN12_GLOBAL__N_18k_sampleEPKfiPhfiiiiifififPiS3_iS3_iiPvS2_ [-Rpass-analysis=kernel-resource-usage]
    9 | __global__ void __launch_bounds__(kThreads) k_sample(const float* __restrict__ logits, int v, unsigned char* __restrict__ seen,
      | ^
/q3t/kernels/src/sampling.cu:9:1: remark:     TotalSGPRs: 44 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/sampling.cu:9:1: remark:     VGPRs: 22 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/sampling.cu:9:1: remark:     ScratchSize [bytes/lane]: 0 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/sampling.cu:9:1: remark:     Dynamic Stack: False [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/sampling.cu:9:1: remark:     Occupancy [waves/SIMD]: 16 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/sampling.cu:9:1: remark:     SGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/sampling.cu:9:1: remark:     VGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
/q3t/kernels/src/sampling.cu:9:1: remark:     LDS Size [bytes/block]: 35348 [-Rpass-analysis=kernel-resource-usage]
"""

# hipcc of ROCm 5.2 (clang 15), --offload-arch=gfx1030: "SGPRs" and no "Dynamic Stack"; gfx90a adds AGPRs.
CLANG15 = """\
s.cu:9:1: remark: Function Name: _Z16k_register_spillPKfPf [-Rpass-analysis=kernel-resource-usage]
__global__ void __launch_bounds__(256) __attribute__((amdgpu_num_vgpr(16))) k_register_spill(const float* x, float* y) {
^
s.cu:9:1: remark:     SGPRs: 14 [-Rpass-analysis=kernel-resource-usage]
s.cu:9:1: remark:     VGPRs: 16 [-Rpass-analysis=kernel-resource-usage]
s.cu:9:1: remark:     AGPRs: 4 [-Rpass-analysis=kernel-resource-usage]
s.cu:9:1: remark:     ScratchSize [bytes/lane]: 136 [-Rpass-analysis=kernel-resource-usage]
s.cu:9:1: remark:     Occupancy [waves/SIMD]: 16 [-Rpass-analysis=kernel-resource-usage]
s.cu:9:1: remark:     SGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
s.cu:9:1: remark:     VGPRs Spill: 33 [-Rpass-analysis=kernel-resource-usage]
s.cu:9:1: remark:     LDS Size [bytes/block]: 0 [-Rpass-analysis=kernel-resource-usage]
"""


def test_parses_clang21_remarks() -> None:
    gemv, cp, sample = amd_gate.parse_resource_remarks(CLANG21)
    assert gemv.name.startswith("_ZN12_GLOBAL__N_17k_gemv2ItLi2ELb1ELi8E") and gemv.source == "gemv_v2.cu"
    assert (gemv.vgprs, gemv.sgprs, gemv.scratch, gemv.occupancy, gemv.lds) == (101, 41, 144, 12, 384)
    assert gemv.problems() == ["144 B scratch per lane"]
    assert (cp.source, cp.sgpr_spills, cp.vgprs) == ("code_predictor.cu", 118, 195)
    assert cp.problems() == ["spills 118 SGPRs, 0 VGPRs"]
    assert (sample.lds, sample.scratch, sample.dynamic_stack) == (35348, 0, False)
    assert sample.problems() == []


def test_parses_clang15_remarks() -> None:
    (k,) = amd_gate.parse_resource_remarks(CLANG15)
    assert k.name == "_Z16k_register_spillPKfPf"
    assert (k.sgprs, k.vgprs, k.agprs, k.scratch, k.vgpr_spills) == (14, 16, 4, 136, 33)
    assert k.problems() == ["136 B scratch per lane", "spills 0 SGPRs, 33 VGPRs"]


def _result(log: str, rc: int = 0) -> object:
    res = amd_gate.ArchResult("gfx1201", 1.0, rc, log)
    res.usage = amd_gate.parse_resource_remarks(log)
    return res


def test_gated_arch_fails_on_scratch_but_not_on_exempt_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amd_gate, "EXEMPT_SOURCES", {"code_predictor.cu"})
    res = _result(CLANG21)
    amd_gate.check_arch(res, gated=True, funcs=None)
    assert len(res.problems) == 1 and "k_gemv2" in res.problems[0] and "144 B scratch" in res.problems[0]
    # code_predictor.cu spills SGPRs but is exempt; on an arch that is not gated nothing fails.
    ungated = _result(CLANG21)
    amd_gate.check_arch(ungated, gated=False, funcs=None)
    assert ungated.problems == []


def test_warnings_and_failed_builds_fail_every_arch() -> None:
    clean = CLANG21.replace("144", "0")
    res = _result(clean + "api.cu:30:5: warning: macro '__AMDGCN_WAVEFRONT_SIZE' has been marked as deprecated\n")
    amd_gate.check_arch(res, gated=False, funcs=None)
    assert len(res.problems) == 1 and "deprecated" in res.problems[0]
    failed = _result("api.cu:30:5: error: use of undeclared identifier 'x'\n", rc=1)
    amd_gate.check_arch(failed, gated=False, funcs=None)
    (problem,) = failed.problems
    assert "build failed (exit 1)" in problem and "undeclared" in problem
    silent = _result("")  # no remarks: the build did not run what the gate reads
    amd_gate.check_arch(silent, gated=True, funcs=None)
    assert any("no kernel-resource-usage remarks" in p for p in silent.problems)


# llvm-objdump-21 -d of a code object (gfx1201), trimmed.
OBJDUMP = """\

co.elf:	file format elf64-amdgpu

Disassembly of section .text:

0000000000001c00 <_Z15k_scratch_arrayPKfPfi>:
	s_clause 0x1                                               // 000000001C00: BF850001
	s_load_b32 s4, s[0:1], 0x10                                // 000000001C04: F4000100 F8000010
	global_load_b32 v1, v[1:2], off                            // 000000001C14: CA220080 1A1A0082
	scratch_store_b32 off, v1, off offset:4                    // 000000001C20: 4A320004

0000000000001d00 <_ZN12_GLOBAL__N_17k_gemv2ItLi0ELb1ELi2EEEvPKT_iiiPKfS5_fS5_Pf>:
	global_load_b128 v[4:7], v[2:3], off                       // 000000001D00: EE07C000 00000000
.LBB1_2:
	global_load_b128 v[8:11], v[2:3], off offset:512           // 000000001D08: EE07C000 00000000
	s_endpgm                                                   // 000000001D10: BFB00000
"""


def test_splits_a_disassembly_by_function() -> None:
    funcs = amd_gate.split_disassembly(OBJDUMP)
    assert list(funcs) == ["_Z15k_scratch_arrayPKfPfi", "_ZN12_GLOBAL__N_17k_gemv2ItLi0ELb1ELi2EEEvPKT_iiiPKfS5_fS5_Pf"]
    assert funcs["_Z15k_scratch_arrayPKfPfi"][-1] == "scratch_store_b32 off, v1, off offset:4"
    assert funcs["_ZN12_GLOBAL__N_17k_gemv2ItLi0ELb1ELi2EEEvPKT_iiiPKfS5_fS5_Pf"] == [
        "global_load_b128 v[4:7], v[2:3], off",
        "global_load_b128 v[8:11], v[2:3], off offset:512",
        "s_endpgm",
    ]


def _gemv_functions(wide: str) -> dict[str, list[str]]:
    """One function per vectorised GEMV kernel of the library, each with its up-front 16-byte loads."""
    funcs = {}
    for w in "tfa":  # float32, bf16 bits, int8
        for mode in range(3):
            v1 = f"_ZN12_GLOBAL__N_16k_gemvI{w}Li{mode}ELb1EEEvPKT_iiPKfS5_fS5_Pf"
            funcs[v1] = [f"{wide} v[0:3], v[4:5], off"] * 8
            for kind in ("7k_gemv2", "9k_gemv2x2"):
                for pre in (2, 4, 8):
                    name = f"_ZN12_GLOBAL__N_1{kind}I{w}Li{mode}ELb1ELi{pre}EEEvPKT_iiiPKfS5_fS5_Pf"
                    funcs[name] = [f"{wide} v[0:3], v[4:5], off"] * pre
    return funcs


@pytest.mark.parametrize(
    ("arch", "wide"),
    [
        ("gfx1201", "global_load_b128"),
        ("gfx1100", "global_load_b128"),
        ("gfx942", "global_load_dwordx4"),
        ("gfx1030", "global_load_dwordx4"),
    ],
)
def test_gemv_isa_check(arch: str, wide: str) -> None:
    assert amd_gate.wide_load(arch) == wide
    funcs = _gemv_functions(wide)
    assert len(funcs) == amd_gate.GEMV_VEC_COUNT
    report, bad = amd_gate.gemv_load_problems(funcs, arch)
    assert bad == [] and len(report) == amd_gate.GEMV_VEC_COUNT
    # one load short of the up-front ones; 16-bit weight loads in a bf16 kernel; 8-bit ones in an int8
    # kernel; a kernel gone
    short = "_ZN12_GLOBAL__N_17k_gemv2ItLi2ELb1ELi8EEEvPKT_iiiPKfS5_fS5_Pf"
    funcs[short] = funcs[short][1:]
    narrow = "_ZN12_GLOBAL__N_16k_gemvItLi1ELb1EEEvPKT_iiPKfS5_fS5_Pf"
    funcs[narrow] = [*funcs[narrow], "global_load_u16 v1, v[2:3], off"]
    bytewise = "_ZN12_GLOBAL__N_17k_gemv2IaLi0ELb1ELi4EEEvPKT_iiiPKfS5_fS5_Pf"
    funcs[bytewise] = [*funcs[bytewise], "global_load_i8 v1, v[2:3], off"]
    del funcs["_ZN12_GLOBAL__N_19k_gemv2x2IfLi0ELb1ELi2EEEvPKT_iiiPKfS5_fS5_Pf"]
    _, bad = amd_gate.gemv_load_problems(funcs, arch)
    assert len(bad) == 4, bad
    assert any(short in b and "7 global_load" in b and "fewer than its 8 up-front" in b for b in bad)
    assert any("16-bit global loads" in b for b in bad)
    assert any(bytewise in b and "8-bit global loads in a vectorised int8 GEMV" in b for b in bad)
    assert any(f"found {amd_gate.GEMV_VEC_COUNT - 1} vectorised GEMV kernels" in b for b in bad)


def _elf_with_section(name: bytes, data: bytes) -> bytes:
    """A minimal ELF64 file whose section table holds NULL, `name` (data) and .shstrtab."""
    names = b"\0" + name + b"\0.shstrtab\0"
    data_off = 64
    names_off = data_off + len(data)
    shoff = (names_off + len(names) + 7) // 8 * 8
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 2)
    sections = [bytes(64)]
    for name_idx, off, size in ((1, data_off, len(data)), (len(name) + 2, names_off, len(names))):
        sections.append(struct.pack("<IIQQQQIIQQ", name_idx, 1, 0, 0, off, size, 0, 0, 1, 0))
    body = bytes(header) + data + names
    return body + bytes(shoff - len(body)) + b"".join(sections)


def _bundle(entries: list[tuple[str, bytes]]) -> bytes:
    """A clang offload bundle (uncompressed, version 1 layout) of (target id, image) entries."""
    magic = b"__CLANG_OFFLOAD_BUNDLE__"
    head_len = len(magic) + 8 + sum(24 + len(t) for t, _ in entries)
    head, images, offset = magic + struct.pack("<Q", len(entries)), b"", head_len
    for target, image in entries:
        head += struct.pack("<QQQ", offset, len(image), len(target)) + target.encode()
        images += image
        offset += len(image)
    return head + images


def test_extracts_the_code_objects_of_every_source_file() -> None:
    a = _bundle([("host-x86_64-unknown-linux-gnu-", b""), ("hipv4-amdgcn-amd-amdhsa--gfx1201", b"\x7fELF-api")])
    b = _bundle([("host-x86_64-unknown-linux-gnu-", b""), ("hipv4-amdgcn-amd-amdhsa--gfx1201", b"\x7fELF-gemv")])
    lib = _elf_with_section(b".hip_fatbin", a + bytes(4096 - len(a)) + b)
    assert amd_gate.code_objects(lib) == [
        ("hipv4-amdgcn-amd-amdhsa--gfx1201", b"\x7fELF-api"),
        ("hipv4-amdgcn-amd-amdhsa--gfx1201", b"\x7fELF-gemv"),
    ]
    with pytest.raises(ValueError, match="no .hip_fatbin"):
        amd_gate.code_objects(_elf_with_section(b".text", a))
    with pytest.raises(ValueError, match="not a 64-bit ELF"):
        amd_gate.code_objects(b"MZ" + bytes(100))


# Compiled by the gate itself: a private array indexed at run time (scratch), a kernel held to 16
# VGPRs with 32 values live (spills), and one that is clean.
BAD_KERNELS = r"""
#include <hip/hip_runtime.h>
__global__ void __launch_bounds__(256) k_scratch_array(const float* x, float* y, int n) {
    float a[64];
    for (int i = 0; i < 64; ++i) a[i] = x[i * n + threadIdx.x];
    y[threadIdx.x] = a[x[threadIdx.x] > 0.f ? threadIdx.x % 64 : 0];
}
__global__ void __launch_bounds__(256) __attribute__((amdgpu_num_vgpr(16))) k_register_spill(const float* x, float* y) {
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = x[i * 256 + threadIdx.x];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) s += v[i] * v[31 - i];
    y[threadIdx.x] = s;
}
__global__ void __launch_bounds__(256) k_clean(const float* x, float* y) { y[threadIdx.x] = 2.f * x[threadIdx.x]; }
"""


def _gate_toolchain() -> tuple[str, str]:
    """(hipcc command, arch): sid's hipcc 7 through .ci/sid-run where CI built it (Q3T_GATE_HIPCC),
    else a hipcc on PATH (bookworm's ROCm 5.2 knows gfx1030 but not gfx1201)."""
    cmd = os.environ.get("Q3T_GATE_HIPCC")
    if cmd:
        return cmd, "gfx1201"
    if shutil.which("hipcc"):
        return "hipcc", "gfx1030"
    if os.environ.get("Q3T_REQUIRE_TOOLCHAINS") == "1":
        pytest.fail("no hipcc for the AMD gate test (set Q3T_GATE_HIPCC or install hipcc)")
    pytest.skip("hipcc not installed")


@pytest.mark.slow
def test_gate_fails_on_a_kernel_with_scratch_and_spills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hipcc, arch = _gate_toolchain()
    (tmp_path / "src").mkdir()
    shutil.copytree(build.KERNEL_DIR / "include", tmp_path / "include")
    (tmp_path / "src" / "bad.cu").write_text(BAD_KERNELS)
    monkeypatch.chdir(build.KERNEL_DIR.parent)  # Q3T_GATE_HIPCC may be relative to the checkout
    rc = amd_gate.main(
        [
            "--hipcc",
            hipcc,
            "--objdump",
            "none",
            "--arch",
            arch,
            "--gate",
            arch,
            "--jobs",
            "1",
            "--kernel-dir",
            str(tmp_path),
        ]
    )
    out, err = capsys.readouterr()
    print(out, err)
    assert rc == 1, "the gate passed a kernel with scratch memory and spills"
    assert "AMD gate FAILED: 3 problems" in err  # scratch; scratch and spills
    assert "k_scratch_array" in err and "B scratch per lane" in err
    assert "k_register_spill" in err and "spills 0 SGPRs" in err
    assert "k_clean" not in err  # the clean kernel is listed in the table, not among the problems
    assert "k_clean" in out
    # The same kernels on an arch that is not gated: reported, not failed.
    rc = amd_gate.main(
        [
            "--hipcc",
            hipcc,
            "--objdump",
            "none",
            "--arch",
            arch,
            "--gate",
            "",
            "--jobs",
            "1",
            "--kernel-dir",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert rc == 0, capsys.readouterr()
