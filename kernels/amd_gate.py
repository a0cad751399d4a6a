"""The AMD build gate: what hipcc made of the kernels, per arch, and whether the decode loop may ship it.

For each AMD arch it builds the library with the project's own compile command
(`wyoming_qwen3tts.backends.kernels.build.compile_command`, `-Werror`) plus clang's kernel-resource-usage remarks, and
disassembles the code objects inside the built library. It prints, per kernel and arch, VGPRs, AGPRs,
SGPRs, static LDS, scratch, spills and the compiler's occupancy, and fails (exit 1) when
- a build fails or prints a warning,
- on a gated arch (default gfx1201, gfx1100, gfx942), a kernel uses scratch memory, spills registers
  or has a dynamic stack (sources in EXEMPT_SOURCES aside),
- a vectorised GEMV loads its weights in fewer 16-byte loads than it issues up front
  (gfx11/gfx12 `global_load_b128`, gfx9/gfx10 `global_load_dwordx4`), or a bf16 one loads 16-bit values
  (an int8 one 8-bit values).

    python3 kernels/amd_gate.py --arch gfx1201,gfx1100,gfx942          # hipcc and llvm-objdump on PATH
    python3 kernels/amd_gate.py --hipcc ".ci/sid-run hipcc" --objdump ".ci/sid-run llvm-objdump-21" \\
        --arch gfx1201,gfx1200,gfx1100,gfx1151,gfx942,gfx90a --jobs 2   # what .ci/run does

Needs only the standard library and the repository (wyoming_qwen3tts.backends.kernels.build for the flags).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from wyoming_qwen3tts.backends.kernels import build  # noqa: E402 - after the sys.path line above

ALL_ARCHS = ("gfx1201", "gfx1200", "gfx1100", "gfx1151", "gfx942", "gfx90a")
GATED_ARCHS = ("gfx1201", "gfx1100", "gfx942")
# Kernels of these sources may use scratch (none today: every kernel is in the decode loop; the test
# of the gate sets one).
EXEMPT_SOURCES: set[str] = set()

# A vectorised GEMV kernel: v1 k_gemv<W, MODE, true> (8 up-front 16-byte loads per lane) and
# v2 k_gemv2 / k_gemv2x2 <W, MODE, true, PRE> (PRE up front); W t = bf16 (uint16_t), f = float,
# a = int8 (int8_t, Q3T_I8).
GEMV_VEC = re.compile(r"k_gemv(2|2x2)?I([tfa])Li(\d)ELb1E(?:Li(\d+)E)?")
GEMV_VEC_COUNT = 3 * 3 * (3 * 2 + 1)  # dtypes x modes x (PRE choices x one or two vectors, + v1)

_REMARK = re.compile(
    r"^(?P<file>[^\s:][^:\n]*):\d+:\d+: remark: (?P<key>[^:\n]+?): (?P<value>\S+) "
    r"\[-Rpass-analysis=kernel-resource-usage\]$",
    re.MULTILINE,
)
_KEYS = {  # remark key -> KernelUsage field (clang 15 says "SGPRs", clang 21 "TotalSGPRs")
    "VGPRs": "vgprs",
    "AGPRs": "agprs",
    "SGPRs": "sgprs",
    "TotalSGPRs": "sgprs",
    "ScratchSize [bytes/lane]": "scratch",
    "Dynamic Stack": "dynamic_stack",
    "Occupancy [waves/SIMD]": "occupancy",
    "SGPRs Spill": "sgpr_spills",
    "VGPRs Spill": "vgpr_spills",
    "LDS Size [bytes/block]": "lds",
}


@dataclass
class KernelUsage:
    """One function's resource usage as the compiler reports it (remarks of one arch)."""

    name: str  # mangled
    source: str  # file name of its definition
    vgprs: int = 0
    agprs: int = 0
    sgprs: int = 0
    scratch: int = 0  # bytes per lane
    dynamic_stack: bool = False
    occupancy: int = 0  # waves per SIMD (registers, static LDS, the launch bounds)
    sgpr_spills: int = 0
    vgpr_spills: int = 0
    lds: int = 0  # static bytes per block

    def problems(self) -> list[str]:
        bad = []
        if self.scratch:
            bad.append(f"{self.scratch} B scratch per lane")
        if self.sgpr_spills or self.vgpr_spills:
            bad.append(f"spills {self.sgpr_spills} SGPRs, {self.vgpr_spills} VGPRs")
        if self.dynamic_stack:
            bad.append("dynamic stack")
        return bad


def parse_resource_remarks(text: str) -> list[KernelUsage]:
    """The functions of `-Rpass-analysis=kernel-resource-usage` output, in order."""
    found: list[KernelUsage] = []
    for m in _REMARK.finditer(text):
        key, value = m.group("key").strip(), m.group("value")
        if key == "Function Name":
            found.append(KernelUsage(name=value, source=Path(m.group("file")).name))
            continue
        attr = _KEYS.get(key)
        if attr is None or not found:
            continue
        setattr(found[-1], attr, value == "True" if attr == "dynamic_stack" else int(value))
    return found


def code_objects(lib: bytes) -> list[tuple[str, bytes]]:
    """(target id, ELF code object) of every device image in a HIP shared library: the clang offload
    bundles in its .hip_fatbin section, one per source file."""
    if lib[:4] != b"\x7fELF" or lib[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    (shoff,) = struct.unpack_from("<Q", lib, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", lib, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", lib, shoff + i * shentsize) for i in range(shnum)]
    names_off = sections[shstrndx][4]
    fatbin = None
    for name_idx, _type, _flags, _addr, offset, size in sections:
        end = lib.index(b"\0", names_off + name_idx)
        if lib[names_off + name_idx : end] == b".hip_fatbin":
            fatbin = lib[offset : offset + size]
    if fatbin is None:
        raise ValueError("no .hip_fatbin section (not built by hipcc for AMD?)")
    magic = b"__CLANG_OFFLOAD_BUNDLE__"
    if b"CCOB" in fatbin[:8] and magic not in fatbin:
        raise ValueError("compressed offload bundles: build without --offload-compress")
    out = []
    start = fatbin.find(magic)
    while start >= 0:
        (n,) = struct.unpack_from("<Q", fatbin, start + len(magic))
        pos = start + len(magic) + 8
        for _ in range(n):
            offset, size, id_len = struct.unpack_from("<QQQ", fatbin, pos)
            target = fatbin[pos + 24 : pos + 24 + id_len].decode()
            pos += 24 + id_len
            if "amdgcn" in target and size:
                out.append((target, fatbin[start + offset : start + offset + size]))
        start = fatbin.find(magic, pos)
    return out


_SYMBOL = re.compile(r"^[0-9a-f]+ <(?P<name>[^>]+)>:$", re.MULTILINE)


def split_disassembly(text: str) -> dict[str, list[str]]:
    """llvm-objdump -d output -> instruction mnemonics (with operands) per function symbol."""
    funcs: dict[str, list[str]] = {}
    marks = list(_SYMBOL.finditer(text))
    for i, m in enumerate(marks):
        body = text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        lines = [ln.split("//")[0].strip() for ln in body.splitlines()]
        funcs[m.group("name")] = [ln for ln in lines if ln and not ln.endswith(":")]
    return funcs


def wide_load(arch: str) -> str:
    """The 16-byte global load's mnemonic: gfx11/gfx12 renamed gfx9/gfx10's dwordx4 to b128."""
    return "global_load_b128" if re.match(r"gfx1[12]", arch) else "global_load_dwordx4"


_NARROW16 = re.compile(r"\bglobal_load_(u16|i16|ushort|sshort|short_d16\w*|d16\w*)\b")
_NARROW8 = re.compile(r"\bglobal_load_(u8|i8|ubyte|sbyte)\b")


def gemv_load_problems(funcs: dict[str, list[str]], arch: str) -> tuple[list[str], list[str]]:
    """(report lines, problems) of the ISA check on the vectorised GEMVs."""
    wide = wide_load(arch)
    report, bad, checked = [], [], 0
    for name, lines in sorted(funcs.items()):
        m = GEMV_VEC.search(name)
        if not m:
            continue
        checked += 1
        want = int(m.group(4)) if m.group(1) else 8
        n_wide = sum(ln.startswith(wide) for ln in lines)
        n_narrow = sum(bool(_NARROW16.match(ln)) for ln in lines)
        n_bytes = sum(bool(_NARROW8.match(ln)) for ln in lines)
        report.append(f"{m.group(1) or 'v1'} {m.group(0)}: {n_wide} {wide}, {n_narrow} 16-bit, {n_bytes} 8-bit loads")
        if n_wide < want:
            bad.append(f"{arch} {name}: {n_wide} {wide}, fewer than its {want} up-front weight loads")
        if m.group(2) == "t" and n_narrow:
            bad.append(f"{arch} {name}: {n_narrow} 16-bit global loads in a vectorised bf16 GEMV")
        if m.group(2) == "a" and n_bytes:
            bad.append(f"{arch} {name}: {n_bytes} 8-bit global loads in a vectorised int8 GEMV")
    if checked != GEMV_VEC_COUNT:
        bad.append(f"{arch}: found {checked} vectorised GEMV kernels, expected {GEMV_VEC_COUNT}")
    return report, bad


@dataclass
class ArchResult:
    arch: str
    seconds: float
    returncode: int
    log: str
    usage: list[KernelUsage] = field(default_factory=list)
    isa_report: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _warnings(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if re.search(r"\bwarning:", ln)]


def check_arch(res: ArchResult, gated: bool, funcs: dict[str, list[str]] | None) -> None:
    """Fills res.problems from the build log, the remarks and (when given) the disassembly."""
    if res.returncode != 0:
        errors = [ln for ln in res.log.splitlines() if "error" in ln][:20]
        res.problems.append(f"{res.arch}: build failed (exit {res.returncode}):\n  " + "\n  ".join(errors))
        return
    res.problems += [f"{res.arch}: {w}" for w in _warnings(res.log)]
    if not res.usage:
        res.problems.append(f"{res.arch}: no kernel-resource-usage remarks in the build output")
    if gated:
        for k in res.usage:
            if k.source not in EXEMPT_SOURCES:
                res.problems += [f"{res.arch} {k.name} ({k.source}): {p}" for p in k.problems()]
    if funcs is not None:
        res.isa_report, bad = gemv_load_problems(funcs, res.arch)
        res.problems += bad


def build_command(hipcc: list[str], arch: str, out: Path) -> list[str]:
    """The project's own build of the library for one arch (-Werror), with resource remarks."""
    tc = build.Toolchain("hipcc", hipcc[0], "", (arch,))
    cmd = build.compile_command(tc, out, werror=True)
    return hipcc + cmd[1:] + ["-Rpass-analysis=kernel-resource-usage"]


def build_arch(hipcc: list[str], objdump: list[str] | None, arch: str, work: Path, gated: bool) -> ArchResult:
    out = work / arch / f"libq3t-{arch}.so"
    out.parent.mkdir(parents=True)
    t0 = time.monotonic()
    env = dict(os.environ, HIP_PLATFORM="amd")
    cmd = build_command(hipcc, arch, out)
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=out.parent)
    res = ArchResult(arch, 0.0, proc.returncode, proc.stdout + proc.stderr)
    res.usage = parse_resource_remarks(res.log)
    funcs = None
    if proc.returncode == 0 and objdump is not None:
        paths = []
        for i, (_target, image) in enumerate(code_objects(out.read_bytes())):
            p = out.parent / f"co{i}.elf"
            p.write_bytes(image)
            paths.append(str(p))
        dis = subprocess.run(
            [*objdump, "-d", *paths], check=False, capture_output=True, text=True, env=env, cwd=out.parent
        )
        if dis.returncode != 0:
            res.problems.append(f"{arch}: {' '.join(objdump)} failed: {dis.stderr[-2000:]}")
        funcs = split_disassembly(dis.stdout)
    res.seconds = time.monotonic() - t0
    check_arch(res, gated, funcs)
    return res


_DEMANGLE_CACHE: dict[str, str] = {}


def short_names(names: list[str]) -> dict[str, str]:
    """Readable kernel names: demangled (c++filt, where present), without namespaces and parameters;
    uint16_t template arguments are bf16 in this tree, int8_t (signed char) ones int8 weights."""
    todo = [n for n in names if n not in _DEMANGLE_CACHE]
    cxxfilt = shutil.which("c++filt")
    demangled = todo
    if todo and cxxfilt:
        proc = subprocess.run([cxxfilt], input="\n".join(todo), check=False, capture_output=True, text=True)
        out = proc.stdout.splitlines()
        if len(out) == len(todo):
            demangled = out
    for raw, d in zip(todo, demangled):
        d = d.replace("(anonymous namespace)::", "").replace("unsigned short", "bf16").replace("signed char", "int8")
        depth, cut = 0, len(d)
        for i, ch in enumerate(d):  # drop the parameter list: the first '(' outside template brackets
            depth += ch == "<"
            depth -= ch == ">"
            if ch == "(" and depth == 0:
                cut = i
                break
        d = d[:cut]
        _DEMANGLE_CACHE[raw] = d.removeprefix("void ")
    return {n: _DEMANGLE_CACHE[n] for n in names}


def table(res: ArchResult) -> str:
    names = short_names([k.name for k in res.usage])
    head = (
        f"{'kernel':58} {'VGPR':>4} {'AGPR':>4} {'SGPR':>4} {'LDS B':>6} {'scr B':>5} {'spill s/v':>9} "
        f"{'waves/SIMD':>10}"
    )
    rows = [f"== {res.arch} ({res.seconds:.0f} s): {len(res.usage)} functions", head]
    for k in sorted(res.usage, key=lambda u: (u.source, names[u.name])):
        name = names[k.name] + (" *" if k.source in EXEMPT_SOURCES else "")
        rows.append(
            f"{name[:58]:58} {k.vgprs:>4} {k.agprs:>4} {k.sgprs:>4} {k.lds:>6} {k.scratch:>5} "
            f"{f'{k.sgpr_spills}/{k.vgpr_spills}':>9} {k.occupancy:>10}"
        )
    return "\n".join(rows)


def _archs(text: str) -> list[str]:
    return [a for a in re.split(r"[,;\s]+", text) if a]


def _command(text: str) -> list[str]:
    """A command line; a relative program path (".ci/sid-run") is made absolute, the builds run elsewhere."""
    cmd = shlex.split(text)
    if cmd and "/" in cmd[0]:
        cmd[0] = str(Path(cmd[0]).resolve())
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hipcc", default=os.environ.get("HIPCC", "hipcc"), help="hipcc (a command line)")
    ap.add_argument("--objdump", default="llvm-objdump", help="llvm-objdump command; 'none' skips the ISA check")
    ap.add_argument("--arch", default=",".join(ALL_ARCHS))
    ap.add_argument("--gate", default=",".join(GATED_ARCHS), help="archs where scratch and spills fail the gate")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quiet", action="store_true", help="no resource tables, only problems")
    ap.add_argument("--isa-report", action="store_true", help="16-byte load counts of every vectorised GEMV")
    ap.add_argument("--kernel-dir", type=Path, help="another kernel tree (src/, include/) built the same way")
    args = ap.parse_args(argv)
    kernel_dir = build.KERNEL_DIR
    try:
        build.KERNEL_DIR = args.kernel_dir or kernel_dir
        return _run(args)
    finally:
        build.KERNEL_DIR = kernel_dir


def _run(args: argparse.Namespace) -> int:
    hipcc = _command(args.hipcc)
    objdump = None if args.objdump == "none" else _command(args.objdump)
    missing = [c[0] for c in (hipcc, objdump) if c and shutil.which(c[0]) is None]
    if missing:
        print(f"AMD gate: not found: {', '.join(missing)} (see --hipcc / --objdump)", file=sys.stderr)
        return 2
    archs = _archs(args.arch)
    gated = set(_archs(args.gate))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="q3t-amd-gate-") as tmp, ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(build_arch, hipcc, objdump, a, Path(tmp), a in gated) for a in archs]
        results = [f.result() for f in futures]
    problems = [p for r in results for p in r.problems]
    for r in results:
        if not args.quiet:
            print(table(r))
            if args.isa_report:
                print("\n".join(r.isa_report))
            elif r.isa_report:
                counts = sorted({int(line.split(": ")[1].split()[0]) for line in r.isa_report})
                print(f"ISA: {len(r.isa_report)} vectorised GEMVs, {counts[0]}-{counts[-1]} {wide_load(r.arch)} each")
            print()
    if any(k.source in EXEMPT_SOURCES for r in results for k in r.usage):
        print(f"* exempt from the scratch/spill rule: {', '.join(sorted(EXEMPT_SOURCES))}")
    print(
        f"AMD gate: {len(archs)} archs ({', '.join(archs)}) built with -Werror in {time.monotonic() - t0:.0f} s; "
        f"scratch/spills gated on {', '.join(a for a in archs if a in gated) or 'none'}"
    )
    if problems:
        print(f"AMD gate FAILED: {len(problems)} problems", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print("AMD gate passed: no warnings, no scratch or spills on the gated archs, 16-byte GEMV weight loads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
