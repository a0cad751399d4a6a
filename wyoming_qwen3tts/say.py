"""`python -m wyoming_qwen3tts.say`: text -> WAV file with one voice, for people and tests."""

from __future__ import annotations

import argparse
import logging
import sys
import time
import wave
from pathlib import Path

import numpy as np

from .engine import Engine, SynthesisRequest
from .errors import Qwen3TTSError
from .model.config import DEFAULT_MODEL
from .options import EngineOptions
from .request import SamplingOverrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m wyoming_qwen3tts.say", description=__doc__)
    p.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint directory or Hugging Face repo id")
    p.add_argument("--data-dir", type=Path, default=None, help="where downloaded models are kept")
    p.add_argument("--voice", required=True, help="speaker, e.g. ryan, vivian, ono_anna")
    p.add_argument("--text", required=True)
    p.add_argument("--out", type=Path, required=True, help="output .wav (24 kHz, 16-bit mono)")
    p.add_argument("--language", default="auto", help="auto, english, chinese, ... (default auto)")
    p.add_argument("--instruct", default=None, help="speaking style (1.7B only)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of the model's sampling")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=EngineOptions.device, help="auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default=EngineOptions.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--backend", default=EngineOptions.backend, choices=["auto", "kernels", "torch"])
    p.add_argument("--weights", default=EngineOptions.weights, choices=["bf16", "int8"],
                   help="the Talker's and CodePredictor's matrices as loaded, or int8 (README, 8-bit weights)")  # fmt: skip
    p.add_argument("--max-frames", type=int, default=None,
                   help=f"exactly this limit on 80 ms frames (default: the sentence's own budget, at most {EngineOptions.max_frames}; "
                        "see README, What is spoken)")  # fmt: skip
    p.add_argument("--streaming-text", action="store_true", help="feed text dual-track (the reference's non_streaming_mode=False)")
    p.add_argument("--codes-out", type=Path, default=None, help="also write the codes [frames, 16] as .npy")
    p.add_argument("--debug", action="store_true")
    return p


def write_wav(path: Path, pcm: bytes, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="%(levelname)s %(message)s")
    try:
        options = EngineOptions(data_dir=args.data_dir, device=args.device, dtype=args.dtype, backend=args.backend,
                                weights=args.weights, max_frames=args.max_frames or EngineOptions.max_frames,
                                sampling=SamplingOverrides(greedy=args.greedy), max_streams=1)  # one request: no batching  # fmt: skip
        engine = Engine.from_pretrained(args.model, options)
        request = SynthesisRequest(
            text=args.text,
            speaker=args.voice,
            language=args.language,
            instruct=args.instruct,
            seed=args.seed,
            max_frames=args.max_frames,
            non_streaming_text=not args.streaming_text,
        )
        engine.validate(request)
        started = time.monotonic()
        first_audio = None
        pcm: list[bytes] = []
        codes: list[np.ndarray] = []
        for chunk in engine.synthesize(request):
            first_audio = first_audio if first_audio is not None else time.monotonic() - started
            pcm.append(chunk.pcm)
            codes.append(chunk.codes)
        elapsed = time.monotonic() - started
    except (Qwen3TTSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    audio = b"".join(pcm)
    frames = sum(len(c) for c in codes)
    write_wav(args.out, audio, engine.sample_rate)
    if args.codes_out is not None:
        np.save(args.codes_out, np.concatenate(codes) if codes else np.zeros((0, 16), dtype=np.int64))
    seconds = len(audio) / 2 / engine.sample_rate
    rtf = elapsed / seconds if seconds else float("nan")
    print(
        f"wrote {args.out}: {seconds:.2f} s of audio, {frames} frames, {elapsed:.2f} s "
        f"(first audio {0 if first_audio is None else first_audio * 1000:.0f} ms), RTF {rtf:.3f}, "
        f"backend {engine.info.backend} on {engine.info.device}/{engine.info.dtype}, {engine.info.weights} weights"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
