"""Gets qwentts.cpp ready for the side-by-side bench (benchmarks/qwentts_cpp.py): the folder that travels to the GPU
box, the runtime unpacked from it there, and our random checkpoints in its GGUF format.

    python -m benchmarks.qwentts_cpp_prepare carry --wheel REALTIMETTS_WHL --cudart-wheel CUDART_WHL
        --gguf-wheel GGUF_WHL --convert CONVERT_PY [--keep-arch 90] [--out .carry-qcpp]
    python -m benchmarks.qwentts_cpp_prepare runtime [--carry .carry-qcpp] [--out /tmp/qcpp]
    python -m benchmarks.qwentts_cpp_prepare convert --model CKPT --out DIR [--quants bf16,q8_0] [--runtime /tmp/qcpp]

What runs is the PyPI wheel realtimetts-qwen-native 0.2.0 (qwentts.cpp b91bca4, C ABI 5, built for CUDA 12.8), its
own binaries and its own ctypes binding; nothing of qwentts.cpp is compiled here. Two things stand between that wheel
and a GPU box that takes 64 MiB a call and has CUDA 13 only:
- size: libggml-cuda.so.0 is 112 MB, mostly device code for five targets. `carry` keeps one (sm_90, the H200's) and
  zeroes the payloads of the others in place, so the file keeps its layout and xz shrinks it to about a fifth;
- cuBLAS 12 (a 600 MB wheel): `runtime` compiles qwentts_cpp_native/cublas12.c, a libcublas.so.12 that forwards
  the twelve entry points the library imports to the box's cuBLAS 13. The CUDA 12 runtime itself (1 MB, from the
  nvidia-cuda-runtime-cu12 wheel) travels; NVIDIA's driver runs CUDA 12 programs.
On a machine without a driver, `runtime` also compiles qwentts_cpp_native/cuda_stub.c so the loader can load the
library at all and ggml falls back to its CPU backend (the local check).

`convert` runs qwentts.cpp's own converter (convert.py, which travels too) on one of our checkpoints, and makes the
two changes the bench needs while it writes:
- weights: its converter writes F32 and its C++ quantize tool makes BF16 and Q8_0 from that. We compile none of its
  code, so the same per-tensor policy (tools/quantize.cpp should_quantize: 1-D tensors, snake alpha/beta, the RVQ
  codebooks and their projections and the speaker encoder's last FC stay F32; rows not a whole number of blocks fall
  back to F16) is applied with the gguf package's quantizers as each tensor is added;
- end of speech: qwen3-tts.codec.eos_id is written as the codec vocabulary size (3072) instead of 2150. qwentts.cpp
  reads EOS only from that key; it masks ids [2048, 3072) except EOS before sampling code 0 and stops when the sample
  equals EOS, so 2150 is masked like every other special id and nothing stops a run before max_new_tokens frames.
  Its API has no min-frames or ignore-EOS option, and its ABI 5 token ban (onset_silence_ids) is limited to acoustic
  ids, 16 frames and Base x-vector requests.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

NATIVE_DIR = Path(__file__).resolve().parent / "qwentts_cpp_native"
CARRY_TARBALL = "qwentts-cpp.tar.xz"
CARRY_MANIFEST = "MANIFEST.json"
CUDA_LIBRARY = "qwentts_cpp/lib/libggml-cuda.so.0"
QUANTS = ("bf16", "q8_0", "f32")
# The codec vocabulary: ids 0..2047 are codes, 2048..3071 specials (qwen3-tts-model.md §2.2).
CODEC_VOCAB = 3072
EOS_KEY = "qwen3-tts.codec.eos_id"

# Fatbin container: a header (magic, version, header size, size of the entries) followed by entries, each a header
# (kind 1 = PTX, 2 = ELF cubin; its size; payload size; ...; the target at byte 28) and its payload.
_FATBIN_MAGIC = 0xBA55ED50


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _elf_section(data: bytes | bytearray, name: str) -> tuple[int, int]:
    """(file offset, size) of a section of a 64-bit little-endian ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    str_off = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        base = shoff + i * shentsize
        name_off = struct.unpack_from("<I", data, base)[0]
        end = data.index(b"\0", str_off + name_off)
        if bytes(data[str_off + name_off : end]).decode() == name:
            offset, size = struct.unpack_from("<QQ", data, base + 0x18)
            return offset, size
    raise ValueError(f"no {name} section")


def fatbin_entries(data: bytes | bytearray) -> list[dict[str, int]]:
    """Every entry of every fatbin in the .nv_fatbin section: which fatbin (blob), kind (1 PTX, 2 cubin), target
    (e.g. 90), where its payload starts and how long it is."""
    start, size = _elf_section(data, ".nv_fatbin")
    out: list[dict[str, int]] = []
    pos, end = start, start + size
    blob = 0
    while pos + 16 <= end:
        magic, _version, header, body = struct.unpack_from("<IHHQ", data, pos)
        if magic != _FATBIN_MAGIC:
            pos += 8  # padding between fatbins
            continue
        entry, body_end = pos + header, pos + header + body
        while entry < body_end:
            kind, _ever, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            out.append({"blob": blob, "kind": kind, "arch": arch, "offset": entry + entry_header, "size": payload})
            entry += entry_header + payload
        pos = (body_end + 7) & ~7  # the next one starts 8-byte aligned (the section itself is)
        blob += 1
    return out


def keep_one_target(data: bytearray, arch: int) -> dict[str, Any]:
    """Zero the payload of every fatbin entry that is not the `arch` cubin, in place. The CUDA runtime loads the
    cubin of the GPU's own target and reads no other entry, so on that GPU the library behaves as before; on any
    other it finds no kernel image. Returns what was kept and zeroed (bytes per kind/target)."""
    entries = fatbin_entries(data)
    blobs = {e["blob"] for e in entries}
    covered = {e["blob"] for e in entries if e["kind"] == 2 and e["arch"] == arch}
    if not covered or covered != blobs:  # a fatbin without one would need its zeroed PTX at run time
        raise ValueError(f"{len(blobs) - len(covered)} of the library's {len(blobs)} fatbins have no sm_{arch} cubin")
    kept: dict[str, int] = {}
    zeroed: dict[str, int] = {}
    for e in entries:
        label = f"{'cubin' if e['kind'] == 2 else 'ptx'}_{e['arch']}"
        if e["kind"] == 2 and e["arch"] == arch:
            kept[label] = kept.get(label, 0) + e["size"]
            continue
        data[e["offset"] : e["offset"] + e["size"]] = bytes(e["size"])
        zeroed[label] = zeroed.get(label, 0) + e["size"]
    return {"kept": kept, "zeroed": zeroed}


def _add_bytes(tar: tarfile.TarFile, name: str, payload: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(payload), mode, 0
    tar.addfile(info, io.BytesIO(payload))


def build_carry(
    wheel: Path, cudart_wheel: Path, gguf_wheel: Path, convert: Path, out: Path, keep_arch: int = 90
) -> dict[str, Any]:
    """Write out/qwentts-cpp.tar.xz and out/MANIFEST.json: the wheel's package (libggml-cuda reduced to one
    target), the CUDA 12 runtime library, the gguf package and qwentts.cpp's converter. Fetches nothing."""
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "inputs": {p.name: _sha256(p) for p in (wheel, cudart_wheel, gguf_wheel, convert)},
        "keep_arch": keep_arch,
        "files": {},
    }
    tarball = out / CARRY_TARBALL
    with tarfile.open(tarball, "w:xz", preset=6) as tar:
        with zipfile.ZipFile(wheel) as zf:
            for item in zf.infolist():
                if item.is_dir() or ".dist-info/" in item.filename:
                    continue
                payload = zf.read(item)
                if item.filename == CUDA_LIBRARY:
                    buf = bytearray(payload)
                    manifest["fatbin"] = keep_one_target(buf, keep_arch)
                    payload = bytes(buf)
                mode = 0o755 if item.filename.endswith((".so", ".so.0", ".so.1.0.0")) else 0o644
                _add_bytes(tar, "site/" + item.filename, payload, mode)
                manifest["files"]["site/" + item.filename] = hashlib.sha256(payload).hexdigest()
        with zipfile.ZipFile(gguf_wheel) as zf:
            for item in zf.infolist():
                if item.filename.startswith("gguf/") and not item.is_dir():
                    _add_bytes(tar, "site/" + item.filename, zf.read(item))
        with zipfile.ZipFile(cudart_wheel) as zf:
            name = next(n for n in zf.namelist() if n.endswith("/libcudart.so.12"))
            _add_bytes(tar, "cuda12/libcudart.so.12", zf.read(name), 0o755)
        _add_bytes(tar, "convert.py", convert.read_bytes())
    manifest["tarball"] = {"bytes": tarball.stat().st_size, "sha256": _sha256(tarball)}
    (out / CARRY_MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def _compile(source: Path, output: Path, extra: Sequence[str] = ()) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc or gcc) to build the CUDA 12 stand-ins")
    cmd = [cc, "-shared", "-fPIC", "-O2", "-o", str(output), str(source), f"-Wl,-soname,{output.name}", *extra]
    subprocess.run(cmd, check=True)


def _has_driver() -> bool:
    import ctypes.util

    return ctypes.util.find_library("cuda") is not None or any(
        Path(d, "libcuda.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64")
    )


def build_runtime(carry: Path, out: Path, stub: bool | None = None) -> dict[str, Any]:
    """Unpack the carry folder into out (site/, cuda12/, convert.py) and compile the cuBLAS 12 stand-in into
    out/cuda12; with stub (default: when no NVIDIA driver is installed) also the libcuda.so.1 stand-in into
    out/stub."""
    manifest = json.loads((carry / CARRY_MANIFEST).read_text())
    tarball = carry / CARRY_TARBALL
    if _sha256(tarball) != manifest["tarball"]["sha256"]:
        raise RuntimeError(f"{tarball} does not match {carry / CARRY_MANIFEST}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tarfile.open(tarball, "r:xz") as tar:
        tar.extractall(out, filter="data")
    _compile(
        NATIVE_DIR / "cublas12.c",
        out / "cuda12" / "libcublas.so.12",
        ["-Wl,--version-script=" + str(NATIVE_DIR / "cublas12.map"), "-ldl"],
    )
    if stub is None:
        stub = not _has_driver()
    if stub:
        (out / "stub").mkdir()
        _compile(NATIVE_DIR / "cuda_stub.c", out / "stub" / "libcuda.so.1")
    (out / CARRY_MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


# -- conversion -------------------------------------------------------------------------------------------------


def keeps_source_dtype(name: str, n_dims: int) -> bool:
    """qwentts.cpp's tools/quantize.cpp should_quantize, negated, for the qwen3-tts and qwen3-tts-tokenizer names."""
    if n_dims < 2:
        return True
    snake = (".snake.", ".act1.", ".act2.", ".snake1.", ".snake2.")
    if any(s in name for s in snake) and name.endswith((".alpha", ".beta")):
        return True
    return "tok_enc.vq_" in name or "tok_dec.vq_" in name or "spk_enc.fc.weight" in name


def tensor_type(name: str, shape: Sequence[int], quant: str) -> str:
    """The GGUF type a tensor is written in for a variant (bf16, q8_0, f32): as quantize.cpp picks it."""
    if quant == "f32" or keeps_source_dtype(name, len(shape)):
        return "f32"
    if quant == "q8_0" and shape[-1] % 32:  # ne[0] is the last numpy axis; Q8_0 blocks hold 32
        return "f16"
    return quant


def _load_converter(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("qwentts_cpp_convert", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _policy_writer(gguf: Any, quant: str, eos_id: int, counts: dict[str, int]) -> type:
    """A GGUFWriter that writes each tensor in its variant's type and EOS as eos_id."""
    qtypes = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}

    class PolicyWriter(gguf.GGUFWriter):  # type: ignore[misc, name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if quant != "f32":  # as quantize.cpp marks its outputs
                self.add_uint32("general.quantization_version", 2)
                self.add_string("general.file_type", quant.upper())

        def add_uint32(self, key: str, val: int) -> None:
            super().add_uint32(key, eos_id if key == EOS_KEY else val)

        def add_tensor(self, name: str, tensor: Any, *args: Any, **kwargs: Any) -> None:
            kind = tensor_type(name, tensor.shape, quant)
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "f16":
                super().add_tensor(name, tensor.astype("float16"))
            elif kind in qtypes:
                data = gguf.quants.quantize(tensor, qtypes[kind])
                super().add_tensor(name, data, raw_dtype=qtypes[kind])
            else:
                super().add_tensor(name, tensor, *args, **kwargs)

    return PolicyWriter


def gguf_paths(folder: Path, quant: str) -> tuple[Path, Path]:
    """(talker, codec) GGUF files of one variant in a converted folder."""
    return folder / f"talker-{quant.upper()}.gguf", folder / f"codec-{quant.upper()}.gguf"


def convert_checkpoint(
    model: Path, out: Path, quants: Iterable[str], convert: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Convert our checkpoint (release layout) to qwentts.cpp's talker and codec GGUF files, one pair per variant,
    with EOS unreachable. Skips a variant whose two files exist. Returns per variant its seconds and type counts."""
    import gguf

    cfg = json.loads((model / "config.json").read_text())
    size = {"1b7": "1.7B", "0b6": "0.6B"}.get(cfg.get("tts_model_size", ""), cfg.get("tts_model_size", "?"))
    vocab = int(cfg["talker_config"]["vocab_size"])
    if vocab != CODEC_VOCAB:
        raise ValueError(f"{model}: talker vocab {vocab}, expected {CODEC_VOCAB}")
    converter = _load_converter(convert)
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {}
    original = gguf.GGUFWriter
    for quant in quants:
        if quant not in QUANTS:
            raise ValueError(f"unknown variant {quant!r}: choose from {', '.join(QUANTS)}")
        talker, codec = gguf_paths(out, quant)
        if talker.exists() and codec.exists():
            log(f"[qcpp] {talker.name}, {codec.name}: present")
            continue
        counts: dict[str, int] = {}
        started = time.perf_counter()
        # convert.py builds its writer as gguf.GGUFWriter(...), looked up when it runs.
        gguf.GGUFWriter = _policy_writer(gguf, quant, CODEC_VOCAB, counts)
        try:
            for part in (talker, codec):
                part.with_suffix(".tmp").unlink(missing_ok=True)
            rc = converter.convert_talker_base(model, talker.with_suffix(".tmp"), size)
            rc |= converter.convert_tokenizer_12hz(model / "speech_tokenizer", codec.with_suffix(".tmp"))
        finally:
            gguf.GGUFWriter = original
        if rc:
            raise RuntimeError(f"convert.py failed on {model} ({quant})")
        for part in (talker, codec):
            part.with_suffix(".tmp").rename(part)
        done[quant] = {"seconds": time.perf_counter() - started, "types": counts}
        log(f"[qcpp] {quant}: {talker.name} + {codec.name} in {done[quant]['seconds']:.1f} s, types {counts}")
    return done


def read_eos(path: Path) -> int:
    """The EOS id a converted talker GGUF carries."""
    import gguf

    field = gguf.GGUFReader(str(path)).get_field(EOS_KEY)
    if field is None:
        raise ValueError(f"{path} has no {EOS_KEY}")
    return int(field.parts[field.data[0]][0])


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.qwentts_cpp_prepare", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("carry", help="write the folder that travels to the GPU box")
    c.add_argument("--wheel", type=Path, required=True, help="realtimetts_qwen_native-0.2.0-*.whl")
    c.add_argument("--cudart-wheel", type=Path, required=True, help="nvidia_cuda_runtime_cu12-*.whl")
    c.add_argument("--gguf-wheel", type=Path, required=True, help="gguf-*.whl")
    c.add_argument("--convert", type=Path, required=True, help="qwentts.cpp's convert.py")
    c.add_argument("--keep-arch", type=int, default=90, help="the one CUDA target whose cubins are kept")
    c.add_argument("--out", type=Path, default=Path(".carry-qcpp"))
    r = sub.add_parser("runtime", help="unpack the carry folder and compile the CUDA 12 stand-ins")
    r.add_argument("--carry", type=Path, default=Path(".carry-qcpp"))
    r.add_argument("--out", type=Path, default=Path("/tmp/qcpp"))
    r.add_argument("--stub", choices=("auto", "yes", "no"), default="auto", help="libcuda.so.1 stand-in")
    v = sub.add_parser("convert", help="our checkpoint -> qwentts.cpp GGUF files")
    v.add_argument("--model", type=Path, required=True)
    v.add_argument("--out", type=Path, required=True)
    v.add_argument("--quants", default="bf16,q8_0")
    v.add_argument("--runtime", type=Path, default=Path("/tmp/qcpp"), help="holds convert.py and site/gguf")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.cmd == "carry":
        m = build_carry(args.wheel, args.cudart_wheel, args.gguf_wheel, args.convert, args.out, args.keep_arch)
        print(json.dumps({k: m[k] for k in ("tarball", "fatbin", "inputs")}, indent=1))
    elif args.cmd == "runtime":
        build_runtime(args.carry, args.out, None if args.stub == "auto" else args.stub == "yes")
        print(f"[qcpp] runtime in {args.out}")
    else:
        sys.path.insert(0, str(args.runtime / "site"))
        quants = [q for q in args.quants.split(",") if q]
        convert_checkpoint(args.model, args.out, quants, args.runtime / "convert.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
