"""The qwentts.cpp side of the bench without its wheel: the log parsing and stream counts of the worker, the GGUF
weight policy and EOS rewrite of the conversion (through a stand-in converter and gguf module), the device-code
reduction of the carry folder on a small ELF file, the runtime's CUDA 12 stand-ins (compiled with the machine's C
compiler), the streams table, and the "cannot run" row when no runtime is there. The wheel itself is run on the CPU
by hand (benchmarks/qwentts_cpp.py's docstring and the bench's --device cpu); it is 94 MB and not on CI."""

from __future__ import annotations

import ctypes
import json
import struct
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import cli, report
from benchmarks import qwentts_cpp as qcpp
from benchmarks import qwentts_cpp_prepare as prep

# Lines as the wheel's libqwen.so logs them (CPU run of a 0.6B, 8 frames).
PERF_LOG = """[Prompt] Built: 16 ids, N_text=8, N_instruct=0, T_ctx=19, hidden=1024, lang=english (id=2050)
[Pipeline] Generation done : 8 frames
[Perf] PromptBuild 0.2 ms
[Perf] Prefill 1339.3 ms (T_ctx prefill)
[Perf] TTFA 1497.8 ms (first frame codes)
[Perf] TalkerDecode 410.0 ms (8 frames, 51.25 ms/frame)
[Perf] CodePredictor 1300.7 ms (162.59 ms/frame)
[Perf] HostCompose 18.0 ms (c0 sample + next emb)
[Perf] CodecDecode 2059.4 ms
[Perf] Total 5139.6 ms (8 frames, 216.09 ms/frame AR, audio 0.64 s, RTF 8.031)"""


def test_parse_perf_reads_each_synthesis_and_its_autoregressive_time() -> None:
    lines = PERF_LOG.splitlines()
    (one,) = qcpp.parse_perf(lines)
    assert one["frames"] == 8 and one["Prefill"] == 1339.3 and one["CodecDecode"] == 2059.4
    assert one["ar_ms"] == pytest.approx(410.0 + 1300.7 + 18.0)
    # Two streams of a batch retire one after the other: two blocks, in order.
    two = qcpp.parse_perf(lines + [ln.replace("410.0", "420.0") for ln in lines])
    assert [p["TalkerDecode"] for p in two] == [410.0, 420.0]
    assert qcpp.parse_perf(["[Pipeline] EOS at step 3, stopping (slot 0)"]) == []


def test_parse_streams() -> None:
    assert qcpp.parse_streams("16,4,4") == [4, 16]
    for bad in ("1,4", "four"):
        with pytest.raises(SystemExit):
            qcpp.parse_streams(bad)


@pytest.mark.parametrize(
    ("name", "shape", "quant", "expected"),
    [
        ("talker.blk.0.attn_q.weight", (2048, 1024), "q8_0", "q8_0"),
        ("talker.blk.0.attn_q.weight", (2048, 1024), "bf16", "bf16"),
        ("talker.blk.0.attn_norm.weight", (1024,), "q8_0", "f32"),  # 1-D tensors stay
        ("tok_dec.dec.1.conv_t.weight", (96, 192, 7), "q8_0", "f16"),  # 7 is no whole number of Q8_0 blocks
        ("tok_dec.dec.1.conv_t.weight", (96, 192, 7), "bf16", "bf16"),
        ("tok_dec.dec.1.snake.alpha", (1, 96, 1), "bf16", "f32"),
        ("tok_dec.vq_first.output_proj.weight", (512, 256), "q8_0", "f32"),
        ("tok_enc.vq_rest.0.codebook", (2048, 256), "bf16", "f32"),
        ("spk_enc.fc.weight", (2048, 3072), "q8_0", "f32"),
        ("talker.codec_head.weight", (3072, 2048), "f32", "f32"),
    ],
)
def test_tensor_type_follows_the_quantize_tool_policy(name: str, shape: tuple[int, ...], quant: str, expected: str):
    assert prep.tensor_type(name, shape, quant) == expected


# -- conversion through a stand-in gguf module and converter ------------------------------------------------------


def _fake_gguf() -> types.ModuleType:
    """Records what a GGUFWriter is given and writes it as JSON; quantize tags the array with its type."""
    gguf = types.ModuleType("gguf")

    class GGMLQuantizationType:
        BF16 = "BF16"
        Q8_0 = "Q8_0"

    class GGUFWriter:
        def __init__(self, path: str, arch: str) -> None:
            self.path, self.kv, self.tensors = path, {"general.architecture": arch}, {}

        def add_uint32(self, key: str, val: int) -> None:
            self.kv[key] = val

        def add_string(self, key: str, val: str) -> None:
            self.kv[key] = val

        def add_tensor(self, name: str, tensor: Any, raw_shape: Any = None, raw_dtype: Any = None) -> None:
            self.tensors[name] = raw_dtype or str(tensor.dtype)

        def write(self) -> None:
            Path(self.path).write_text(json.dumps({"kv": self.kv, "tensors": self.tensors}))

    gguf.GGMLQuantizationType = GGMLQuantizationType  # type: ignore[attr-defined]
    gguf.GGUFWriter = GGUFWriter  # type: ignore[attr-defined]
    gguf.quants = types.SimpleNamespace(quantize=lambda data, qtype: data.view(np.uint8))  # type: ignore[attr-defined]
    return gguf


CONVERTER = """
import gguf
import numpy as np

def convert_talker_base(checkpoint_dir, out_path, model_size):
    w = gguf.GGUFWriter(str(out_path), "qwen3-tts")
    w.add_uint32("qwen3-tts.talker.vocab_size", 3072)
    w.add_uint32("qwen3-tts.codec.eos_id", 2150)
    w.add_string("qwen3-tts.model_size", model_size)
    w.add_tensor("talker.blk.0.attn_q.weight", np.zeros((64, 64), np.float32))
    w.add_tensor("talker.blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.write()
    return 0

def convert_tokenizer_12hz(checkpoint_dir, out_path):
    w = gguf.GGUFWriter(str(out_path), "qwen3-tts-tokenizer")
    w.add_tensor("tok_dec.dec.1.conv_t.weight", np.zeros((4, 4, 7), np.float32))
    w.add_tensor("tok_dec.vq_first.0.codebook", np.zeros((8, 4), np.float32))
    w.write()
    return 0
"""


def test_convert_rewrites_eos_and_applies_the_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_gguf()
    monkeypatch.setitem(sys.modules, "gguf", fake)
    model = tmp_path / "ck"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"tts_model_size": "0b6", "talker_config": {"vocab_size": 3072}}))
    converter = tmp_path / "convert.py"
    converter.write_text(CONVERTER)
    done = prep.convert_checkpoint(model, tmp_path / "out", ["q8_0", "bf16"], converter, log=lambda s: None)
    assert set(done) == {"q8_0", "bf16"}
    talker, codec = (json.loads(p.read_text()) for p in prep.gguf_paths(tmp_path / "out", "q8_0"))
    assert talker["kv"]["qwen3-tts.codec.eos_id"] == prep.CODEC_VOCAB  # no sample can take it
    assert talker["kv"]["qwen3-tts.model_size"] == "0.6B" and talker["kv"]["general.file_type"] == "Q8_0"
    assert talker["tensors"] == {"talker.blk.0.attn_q.weight": "Q8_0", "talker.blk.0.attn_norm.weight": "float32"}
    assert codec["tensors"] == {"tok_dec.dec.1.conv_t.weight": "float16", "tok_dec.vq_first.0.codebook": "float32"}
    bf16 = json.loads(prep.gguf_paths(tmp_path / "out", "bf16")[1].read_text())
    assert bf16["tensors"]["tok_dec.dec.1.conv_t.weight"] == "BF16"
    assert fake.GGUFWriter.__name__ == "GGUFWriter"  # the converter's writer is put back
    assert not list((tmp_path / "out").glob("*.tmp"))
    # A second call finds both files of a variant and converts nothing.
    assert prep.convert_checkpoint(model, tmp_path / "out", ["q8_0"], converter, log=lambda s: None) == {}


# -- the carry folder and the runtime -----------------------------------------------------------------------------


def _fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    """A fatbin: its 16-byte header, then per entry a 64-byte header (kind, size, payload size, target at 28)."""
    body = b""
    for kind, arch, payload in entries:
        head = struct.pack("<HHIQ", kind, 1, 64, len(payload)) + bytes(12) + struct.pack("<I", arch)
        body += head + bytes(64 - len(head)) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _elf(sections: dict[str, bytes]) -> bytes:
    """A 64-bit little-endian ELF file holding only the given sections (and its section-name table)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    blobs = [*sections.values(), names]
    data = bytearray(64)
    offsets = []
    for blob in blobs:
        offsets.append(len(data))
        data += blob + bytes(-len(blob) % 8)
    shoff = len(data)
    name_at = 1
    headers = [bytes(64)]
    for (name, _), off, blob in zip([*sections.items(), (".shstrtab", b"")], offsets, blobs):
        headers.append(struct.pack("<IIQQQQIIQQ", name_at, 1, 0, 0, off, len(blob), 0, 0, 8, 0))
        name_at += len(name) + 1
    data += b"".join(headers)
    data[:16] = b"\x7fELF\x02\x01\x01" + bytes(9)
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHH", data, 0x3A, 64, len(headers), len(headers) - 1)
    return bytes(data)


def _library() -> tuple[bytes, dict[str, bytes]]:
    payloads = {"ptx75": b"P" * 40, "sm86": b"A" * 24, "sm90": b"N" * 32, "sm90b": b"M" * 8}
    fat = _fatbin([(1, 75, payloads["ptx75"]), (2, 86, payloads["sm86"]), (2, 90, payloads["sm90"])])
    fat += bytes(-len(fat) % 8) + _fatbin([(2, 90, payloads["sm90b"])])
    return _elf({".text": b"\x90" * 16, ".nv_fatbin": fat}), payloads


def test_keep_one_target_zeroes_every_other_payload() -> None:
    lib, payloads = _library()
    entries = prep.fatbin_entries(lib)
    assert [(e["blob"], e["kind"], e["arch"], e["size"]) for e in entries] == [
        (0, 1, 75, 40),
        (0, 2, 86, 24),
        (0, 2, 90, 32),
        (1, 2, 90, 8),
    ]
    buf = bytearray(lib)
    summary = prep.keep_one_target(buf, 90)
    assert summary == {"kept": {"cubin_90": 40}, "zeroed": {"ptx_75": 40, "cubin_86": 24}}
    assert len(buf) == len(lib) and payloads["sm90"] in buf and payloads["sm90b"] in buf
    assert payloads["ptx75"] not in buf and payloads["sm86"] not in buf
    assert buf.count(b"\x90" * 16) == 1  # nothing outside the payloads changed
    with pytest.raises(ValueError, match="2 of the library's 2 fatbins have no sm_80"):
        prep.keep_one_target(bytearray(lib), 80)
    # Every fatbin must hold the kept target: one that only has PTX would need it at run time.
    partial = _elf({".nv_fatbin": _fatbin([(2, 90, b"N")]) + bytes(7) + _fatbin([(1, 75, b"P" * 8)])})
    with pytest.raises(ValueError, match="1 of the library's 2 fatbins"):
        prep.keep_one_target(bytearray(partial), 90)


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, payload in files.items():
            zf.writestr(name, payload)
    return path


def test_carry_then_runtime_round_trip(tmp_path: Path) -> None:
    lib, payloads = _library()
    wheel = _wheel(
        tmp_path / "realtimetts_qwen_native-0.2.0-1cu128-py3-none-manylinux_2_35_x86_64.whl",
        {
            "qwentts_cpp/__init__.py": b"",
            "qwentts_cpp/lib/libqwen.so": b"qwen",
            prep.CUDA_LIBRARY: lib,
            "realtimetts_qwen_native-0.2.0.dist-info/METADATA": b"Name: realtimetts-qwen-native",
        },
    )
    cudart = _wheel(tmp_path / "cudart.whl", {"nvidia/cuda_runtime/lib/libcudart.so.12": b"cudart"})
    gguf = _wheel(tmp_path / "gguf.whl", {"gguf/__init__.py": b"", "gguf-0.19.0.dist-info/METADATA": b""})
    convert = tmp_path / "convert.py"
    convert.write_text("# converter\n")
    manifest = prep.build_carry(wheel, cudart, gguf, convert, tmp_path / "carry")
    assert manifest["fatbin"]["kept"] == {"cubin_90": 40}
    assert set(manifest["inputs"]) == {wheel.name, "cudart.whl", "gguf.whl", "convert.py"}

    out = tmp_path / "rt"
    prep.build_runtime(tmp_path / "carry", out, stub=True)
    slim = (out / "site" / prep.CUDA_LIBRARY).read_bytes()
    assert payloads["sm90"] in slim and payloads["sm86"] not in slim
    assert (out / "cuda12" / "libcudart.so.12").read_bytes() == b"cudart"
    assert (out / "convert.py").read_text() == "# converter\n" and (out / "site" / "gguf" / "__init__.py").exists()
    assert not (out / "site" / "realtimetts_qwen_native-0.2.0.dist-info").exists()
    # The cuBLAS 12 stand-in exports what libggml-cuda.so.0 imports; loading it opens no cuBLAS 13 yet.
    shim = ctypes.CDLL(str(out / "cuda12" / "libcublas.so.12"))
    for name in ("cublasCreate_v2", "cublasGemmEx", "cublasGemmBatchedEx", "cublasGemmStridedBatchedEx"):
        assert hasattr(shim, name)
    stub = ctypes.CDLL(str(out / "stub" / "libcuda.so.1"))
    assert stub.cuInit(0) == 100  # CUDA_ERROR_NO_DEVICE

    (tmp_path / "carry" / prep.CARRY_TARBALL).write_bytes(b"changed")
    with pytest.raises(RuntimeError, match="does not match"):
        prep.build_runtime(tmp_path / "carry", out)


# -- the report and the bench's wiring ----------------------------------------------------------------------------


def test_streams_table_lists_each_stream_count() -> None:
    row: dict[str, Any] = {"size": "1.7b", "engine": "qcpp-q8_0", "ok": True, "streams": []}
    assert report.streams_table([row]) == []
    row["streams"] = [
        {"streams": 4, "aggregate_fps": 400.0, "per_stream_fps": 100.0, "e2e_aggregate_fps": 300.0},
        {"streams": 16, "aggregate_fps": None, "per_stream_fps": 50.0, "e2e_aggregate_fps": 640.0},
    ]
    lines = report.streams_table([row, {"size": "1.7b", "engine": "kernels", "ok": True}])
    assert lines[-2] == "| 1.7b | qwentts.cpp b91bca4 Q8_0 | 4 | 400.0 | 100.0 | 300.0 |"
    assert lines[-1] == "| 1.7b | qwentts.cpp b91bca4 Q8_0 | 16 | – | 50.0 | 640.0 |"


def test_bench_reports_qwentts_cpp_without_a_runtime_as_cannot_run(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    missing = tmp_path / "no-runtime"
    cli.main(
        [
            "--model",
            str(tiny_checkpoint),
            "--backends",
            "qcpp-q8_0",
            "--device",
            "cpu",
            "--frames",
            "2",
            "--runs",
            "1",
            "--qcpp-runtime",
            str(missing),
            "--out",
            str(out),
        ]
    )
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["engine"] == "qcpp-q8_0" and not row["ok"]
    assert f"no qwentts.cpp runtime in {missing}" in row["reason"]
    assert "qwentts.cpp b91bca4 Q8_0" in (out / "results.md").read_text()


def test_qwentts_cpp_is_not_a_default_backend() -> None:
    from benchmarks.common import DEFAULT_ENGINES, ENGINES, QCPP

    assert set(QCPP) <= set(ENGINES) and not set(QCPP) & set(DEFAULT_ENGINES)
    assert set(qcpp.QCPP_ENGINES) == set(QCPP)
