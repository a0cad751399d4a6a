"""Weight-only int8 (model/quant.py, weights = "int8") and the quality check (tools/quant_check.py), on the CPU."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from wyoming_qwen3tts.backends import make_backend
from wyoming_qwen3tts.backends.torch_backend import TorchBackend
from wyoming_qwen3tts.engine import Engine, EngineOptions, SamplingParams, SynthesisRequest
from wyoming_qwen3tts.model.checkpoint import load_checkpoint
from wyoming_qwen3tts.model.quant import QuantLinear, is_quantized, quantize_model, quantize_rows
from wyoming_qwen3tts.model.talker import Qwen3TTSModel
from wyoming_qwen3tts.tools import quant_check

# Thousands of tiny ops: one thread is faster than several on a busy 2-core machine (conftest.one_torch_thread).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

INT8 = EngineOptions(device="cpu", dtype="float32", backend="torch", weights="int8")


def _model(path) -> Qwen3TTSModel:
    ckpt = load_checkpoint(str(path), dtype=torch.float32, model_types=("custom_voice",))
    return Qwen3TTSModel.from_tensors(ckpt.config, ckpt.tensors, dtype=torch.float32, device="cpu")


def test_quantize_rows_is_within_half_a_step_of_every_weight() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 300, generator=gen) * 0.02
    w[3, 17] = 0.9  # one outlier sets its row's step
    w[5] = 0.0
    w = w.bfloat16()
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and q.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (64,)
    wf = w.float()
    error = (wf - q.float() * scale[:, None]).abs()
    # Half a step, plus float32's rounding of q * scale (an exact tie like 63.5 steps lands on the bound).
    assert bool((error <= scale[:, None] / 2 + 1e-6 * wf.abs()).all())
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127  # -128 never used
    assert bool((q.abs().amax(1)[torch.arange(64) != 5] == 127).all())  # each row's largest weight maps to +-127
    assert bool((q[5] == 0).all()) and float(scale[5]) == 1.0  # a zero row: exact zeros
    assert bool((q.float() * scale[:, None])[wf == 0].eq(0).all())  # zeros stay exact zeros


def test_quantize_rows_rounds_half_to_even() -> None:
    q, scale = quantize_rows(torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5]]))
    assert float(scale[0]) == 1.0
    assert q[0].tolist() == [127, 0, 2, 2, 0, -2, 126]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_linear_is_linear_with_the_dequantized_weight(dtype) -> None:
    torch.manual_seed(1)
    linear = nn.Linear(48, 40, bias=True).to(dtype)
    quant = QuantLinear.from_linear(linear)
    assert quant.weight.dtype == torch.int8 and quant.scale.dtype == torch.float32 and quant.bias.dtype == dtype
    assert not quant.weight.requires_grad
    assert set(quant.state_dict()) == {"weight", "scale", "bias"}
    x = torch.randn(5, 48).to(dtype)
    dequantized = (quant.weight.float() * quant.scale[:, None]).to(dtype)
    with torch.no_grad():
        assert torch.equal(quant(x), F.linear(x, dequantized, linear.bias))
        # and close to the original layer: within the int8 bound summed over the inputs
        bound = (quant.scale[:, None] / 2 * x.float().abs().sum(1)[None, :]).T  # [5, 40]
        slack = 0.02 * linear(x).float().abs() + 1e-3 if dtype == torch.bfloat16 else 1e-5
        assert bool(((quant(x).float() - linear(x).float()).abs() <= bound + slack).all())


def _expected_names(model: Qwen3TTSModel, projection: bool) -> set[str]:
    names = {"talker.codec_head"} | {f"talker.code_predictor.lm_head.{j}" for j in range(15)}
    for prefix, layers in (
        ("talker.model", model.cfg.talker.num_hidden_layers),
        ("talker.code_predictor.model", model.cfg.code_predictor.num_hidden_layers),
    ):
        for i in range(layers):
            for part in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
                names.add(f"{prefix}.layers.{i}.{part}")
    if projection:
        names.add("talker.code_predictor.small_to_mtp_projection")
    return names


@pytest.mark.parametrize("size", ["tiny", "tiny-0.6b"])
def test_quantize_model_replaces_exactly_the_matrices(size, tiny_checkpoint, tiny_checkpoint_06b) -> None:
    model = _model(tiny_checkpoint if size == "tiny" else tiny_checkpoint_06b)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    embeddings = {name: m for name, m in model.named_modules() if isinstance(m, nn.Embedding)}
    expected = _expected_names(model, projection=size == "tiny")
    assert expected <= set(linears)
    report = quantize_model(model)

    quantized = {name for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert quantized == expected
    # What stays: the text projection's two Linears, every embedding table, every norm.
    assert {name for name, m in model.named_modules() if isinstance(m, nn.Linear)} == {
        "talker.text_projection.linear_fc1",
        "talker.text_projection.linear_fc2",
    }
    assert all(model.get_submodule(name) is m for name, m in embeddings.items())
    assert model.dtype == torch.float32 and model.device.type == "cpu" and is_quantized(model)

    before = sum(
        linears[n].weight.numel() * 4 + (linears[n].bias.numel() * 4 if linears[n].bias is not None else 0)
        for n in expected
    )
    after = sum(
        linears[n].weight.numel()
        + linears[n].out_features * 4
        + (linears[n].bias.numel() * 4 if linears[n].bias is not None else 0)
        for n in expected
    )
    assert (report.modules, report.bytes_before, report.bytes_after) == (len(expected), before, after)
    assert report.bytes_saved == before - after > 0 and "saved" in str(report)
    for name in expected:  # the same integers quantize_rows gives for the original weight
        q, scale = quantize_rows(linears[name].weight)
        assert torch.equal(model.get_submodule(name).weight, q) and torch.equal(model.get_submodule(name).scale, scale)
    assert quantize_model(model).modules == 0  # already quantized: nothing to do


def _greedy_codes(model: Qwen3TTSModel, engine: Engine, text: str, frames: int):
    prompt = engine.prepare(SynthesisRequest(text=text, speaker="ryan", language="english"))
    return TorchBackend(model).start(prompt, SamplingParams.greedy(), 0, frames).next_frames(frames)


@pytest.fixture(scope="module")
def int8_engine(tiny_checkpoint) -> Engine:
    return Engine.from_pretrained(str(tiny_checkpoint), INT8)


def test_engine_with_int8_weights_speaks(tiny_checkpoint, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="wyoming_qwen3tts.engine"):
        engine = Engine.from_pretrained(str(tiny_checkpoint), INT8)
    assert any(r.message.startswith("int8 weights: Talker and CodePredictor matrices") for r in caplog.records)
    assert engine.info.weights == "int8" and engine.backend.name == "torch" and is_quantized(engine.model)
    pcm, codes = engine.synthesize_all(
        SynthesisRequest(text="Hello there, int8.", speaker="ryan", sampling=SamplingParams.greedy(), max_frames=12)
    )
    assert 0 < len(codes) <= 12 and len(pcm) == len(codes) * 1920 * 2
    assert codes.min() >= 0 and codes[:, 0].max() < engine.config.talker.vocab_size
    assert codes[:, 1:].max() < engine.config.code_predictor.vocab_size


def test_engine_int8_in_bfloat16_speaks(tiny_checkpoint) -> None:
    engine = Engine.from_pretrained(
        str(tiny_checkpoint), EngineOptions(device="cpu", dtype="bfloat16", backend="torch", weights="int8")
    )
    assert engine.model.dtype == torch.bfloat16 and is_quantized(engine.model)
    pcm, codes = engine.synthesize_all(SynthesisRequest(text="Hello.", speaker="ryan", max_frames=6, seed=1))
    assert len(codes) > 0 and len(pcm) == len(codes) * 1920 * 2


def test_int8_greedy_codes_equal_a_float_model_with_the_dequantized_weights(tiny_checkpoint, int8_engine) -> None:
    """QuantLinear in float32 is nn.Linear with weight q * scale: the same greedy codes, frame for frame."""
    dequantized = _model(tiny_checkpoint)
    with torch.no_grad():
        for name, m in int8_engine.model.named_modules():
            if isinstance(m, QuantLinear):
                dequantized.get_submodule(name).weight.copy_(m.dequantized())
    text = "A sentence long enough for some frames."
    ours = _greedy_codes(int8_engine.model, int8_engine, text, 30)
    theirs = _greedy_codes(dequantized, int8_engine, text, 30)
    assert ours.shape == theirs.shape and (ours == theirs).all()


class _GpuModel(nn.Module):
    """Stands in for a quantized model on a GPU: make_backend reads only .device and the modules."""

    device = torch.device("cuda")

    def __init__(self) -> None:
        super().__init__()
        self.head = QuantLinear.from_linear(nn.Linear(4, 4))


def test_the_kernel_backend_takes_int8_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """make_backend hands a quantized model to the kernel backend (the GEMVs read int8, q3t.h Q3T_I8) instead of
    refusing it; here a stand-in records the model, as no GPU builds the real one."""
    from wyoming_qwen3tts.backends.kernels import backend as kernel_backend

    built: list[nn.Module] = []

    class FakeKernelBackend:
        name = "kernels"
        lib = type("Lib", (), {"path": type("P", (), {"name": "libq3t-test.so"})(), "warp_size": 32, "sm_count": 1})()

        def __init__(self, model: nn.Module, options: object = None, prefixes: object = None) -> None:
            built.append(model)

    monkeypatch.setattr(kernel_backend, "KernelBackend", FakeKernelBackend)
    model = _GpuModel()
    backend, reason = make_backend("kernels", model)  # type: ignore[arg-type]
    assert backend.name == "kernels" and built == [model] and "libq3t-test.so" in reason
    backend, _ = make_backend("auto", model)  # type: ignore[arg-type]
    assert backend.name == "kernels" and built == [model, model]


# -- the quality check -------------------------------------------------------------------------------------------


def test_teacher_forcing_reproduces_the_reference_greedy_codes(int8_engine) -> None:
    """Teacher-forced through its own greedy codes, a model's argmax is those codes: the check computes what
    the decode loop computes."""
    model = int8_engine.model
    request = SynthesisRequest(text="Teacher forcing, step by step.", speaker="aiden", language="auto")
    prompt = int8_engine.prepare(request)
    sampling = SamplingParams.greedy()
    codes = TorchBackend(model).start(prompt, sampling, 0, 25).next_frames(25)
    ended = len(codes) < 25
    logits = quant_check.teacher_forced(
        model, prompt, torch.from_numpy(codes), len(codes) + ended, sampling.repetition_penalty
    )
    code0 = logits.code0.argmax(-1)
    assert code0[: len(codes)].tolist() == codes[:, 0].tolist()
    if ended:
        assert int(code0[-1]) == model.cfg.talker.codec_eos_token_id
    assert logits.predictor.argmax(-1).tolist() == codes[:, 1:].tolist()


def test_int8_against_the_same_int8_weights_agrees_everywhere(tiny_checkpoint, int8_engine) -> None:
    """An int8 copy made from a float engine's model holds the integers the int8 engine quantized at load: the
    check must find full agreement and zero KL."""
    float_engine = Engine.from_pretrained(
        str(tiny_checkpoint), EngineOptions(device="cpu", dtype="float32", backend="torch")
    )
    copy8, report = quant_check.int8_copy(float_engine.model)
    assert not is_quantized(float_engine.model) and report.modules == 29  # the original is left as it was
    results = quant_check.run(int8_engine, {"int8": copy8}, sentences=3, frames=10, seed=3, greedy=False)
    assert len(results) == 3
    for r in results:
        assert r["int8"]["code0"]["agreement"] == 1.0 and r["int8"]["code0"]["kl_max"] == 0.0
        assert r["int8"]["code_predictor"]["agreement"] == 1.0 and r["int8"]["code_predictor"]["kl_max"] == 0.0


def test_quant_check_prints_and_writes_agreements(tiny_checkpoint, tmp_path, capsys) -> None:
    out = tmp_path / "check.json"
    argv = [
        "--model",
        str(tiny_checkpoint),
        "--device",
        "cpu",
        "--dtype",
        "bfloat16",
        "--sentences",
        "2",
        "--frames",
        "8",
        "--baseline",
        "--json",
        str(out),
    ]
    assert quant_check.main(argv) == 0
    printed = capsys.readouterr().out
    assert "int8 against the bfloat16 reference" in printed and "float32 against the bfloat16 reference" in printed
    assert "\nall " in printed
    report = json.loads(out.read_text())
    assert report["int8"]["matrices"] == 29 and report["int8"]["bytes_after"] < report["int8"]["bytes_before"]
    assert [s["language"] for s in report["sentences"]] == ["english", "chinese"]
    for name in ("int8", "float32"):
        for key in ("code0", "code_predictor"):
            pooled = report["overall"][name][key]
            assert 0.0 <= pooled["agreement"] <= 1.0 and 0.0 <= pooled["kl_mean"] <= pooled["kl_max"]
        for s in report["sentences"]:
            steps = s[name]["code0"]["per_step"]["agree"]
            assert len(steps) == s["frames"] + s["ended"] and set(steps) <= {0, 1}
            assert len(s[name]["code_predictor"]["per_group"]) == 15
