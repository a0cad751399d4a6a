"""`python -m wyoming_qwen3tts.say`: text -> WAV file with any voice the server offers, for people and tests.

The voice, by the loaded model's kind:
  CustomVoice  --voice SPEAKER (default: the first speaker), or a preset of --config FILE
  Base         --voice NAME of the voices folder (--voices-dir, or DATA_DIR/voices) or of --config FILE,
               or a clip given here: --ref-audio CLIP with --ref-text "what it says" (or --x-vector-only)
  VoiceDesign  --design "the voice's description", or --voice NAME of a designed preset of --config FILE
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
from wyoming.tts import SynthesizeVoice

from .engine import Engine, SynthesisRequest
from .errors import Qwen3TTSError
from .model.config import DEFAULT_MODEL
from .options import EngineOptions
from .request import SamplingOverrides
from .voices import AUTO, VoiceCatalog, VoiceChoice, VoicePreset, language_name, scan_voice_folder


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m wyoming_qwen3tts.say", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint directory or Hugging Face repo id")
    p.add_argument(
        "--data-dir", type=Path, default=None, help="where downloaded models are kept; its voices/ is the voices folder"
    )
    p.add_argument("--text", required=True)
    p.add_argument("--out", type=Path, required=True, help="output .wav (24 kHz, 16-bit mono)")
    voice = p.add_argument_group("voice (one of)")
    voice.add_argument(
        "--voice",
        default=None,
        help="a speaker (ryan, vivian, ono_anna, ...), a preset of --config, or a "
        "cloned voice of the voices folder (default: the model's first speaker)",
    )
    voice.add_argument(
        "--ref-audio", type=Path, default=None, help="Base: clone the voice of this clip (WAV/FLAC/OGG/MP3, 1-30 s)"
    )
    voice.add_argument("--design", default=None, help="VoiceDesign: the voice's description")
    p.add_argument("--ref-text", default=None, help="with --ref-audio: what is said in the clip (in-context cloning)")
    p.add_argument(
        "--x-vector-only",
        action="store_true",
        help="with --ref-audio: clone from the speaker embedding alone (no transcript)",
    )
    p.add_argument(
        "--config", type=Path, default=None, help="the server's TOML settings file, for its [[voices]] presets"
    )
    p.add_argument(
        "--voices-dir",
        type=Path,
        default=None,
        help="folder of cloned voices, NAME.wav + NAME.txt (default: DATA_DIR/voices)",
    )
    p.add_argument("--language", default=AUTO, help="auto, a code or locale tag (en, de-DE), or a name (english)")
    p.add_argument(
        "--instruct",
        default=None,
        help="speaking style (1.7B CustomVoice); on a VoiceDesign model without --design, the voice's description",
    )
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of the model's sampling")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=EngineOptions.device, help="auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default=EngineOptions.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--backend", default=EngineOptions.backend, choices=["auto", "kernels", "torch"])
    p.add_argument(
        "--weights",
        default=EngineOptions.weights,
        choices=["bf16", "int8"],
        help="the Talker's and CodePredictor's matrices as loaded, or int8 (README, 8-bit weights)",
    )
    p.add_argument(
        "--max-frames",
        type=int,
        default=None,
        help=f"exactly this limit on 80 ms frames (default: the sentence's own budget, at most {EngineOptions.max_frames}; "
        "see README, What is spoken)",
    )
    p.add_argument(
        "--streaming-text", action="store_true", help="feed text dual-track (the reference's non_streaming_mode=False)"
    )
    p.add_argument("--codes-out", type=Path, default=None, help="also write the codes [frames, 16] as .npy")
    p.add_argument("--debug", action="store_true")
    return p


def write_wav(path: Path, pcm: bytes, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse combinations that mean nothing, before the model loads."""
    given = [
        flag
        for flag, value in (("--voice", args.voice), ("--ref-audio", args.ref_audio), ("--design", args.design))
        if value is not None
    ]
    if len(given) > 1:
        parser.error(f"give one voice: {' and '.join(given)} were both given")
    if args.ref_audio is None and (args.ref_text is not None or args.x_vector_only):
        parser.error("--ref-text and --x-vector-only go with --ref-audio")
    if args.ref_audio is not None and not args.x_vector_only and not (args.ref_text or "").strip():
        parser.error("--ref-audio needs --ref-text (what is said in the clip), or --x-vector-only")


def voice_folder(args: argparse.Namespace) -> Path | None:
    if args.voices_dir is not None:
        return args.voices_dir
    return args.data_dir / "voices" if args.data_dir is not None else None


def configured_voices(args: argparse.Namespace) -> list[VoicePreset]:
    """The server's voices: --config's presets, then the voices folder's (as the server reads them)."""
    voices: list[VoicePreset] = []
    if args.config is not None:
        from .settings import load_settings  # the server's own reading of the file

        voices = list(load_settings(["--config", str(args.config)]).voices)
    folder = voice_folder(args)
    if folder is not None:
        found, problems = scan_voice_folder(folder)
        for problem in problems:
            logging.getLogger(__name__).warning("%s", problem)
        names = {v.name for v in voices}
        voices += [v for v in found if v.name not in names]
    return voices


def choose_voice(engine: Engine, args: argparse.Namespace) -> VoiceChoice:
    """The voice the arguments name, as the server would speak it (cloning the one cloned voice needed)."""
    kind = engine.model_type
    language = language_name(args.language, engine.languages)
    if args.ref_audio is not None:
        clone = engine.clone_voice(args.ref_audio, args.ref_text, x_vector_only=args.x_vector_only)
        return VoiceChoice(args.ref_audio.name, "", language, None, clone=clone)
    if args.design is not None or (kind == "voice_design" and args.voice is None):
        design = args.design or args.instruct  # a VoiceDesign model's instruct is the voice's description
        if not design:
            raise Qwen3TTSError(
                'a VoiceDesign model speaks a described voice: give --design "the voice\'s description"'
            )
        return VoiceChoice("design", "", language, design)
    presets = [p for p in configured_voices(args) if p.kind == kind]
    if kind == "base":
        if args.voice is None:
            raise Qwen3TTSError(
                "a Base model speaks cloned voices: give --ref-audio CLIP (with --ref-text) or "
                "--voice NAME of the voices folder (--voices-dir)"
            )
        presets = [p for p in presets if p.name == args.voice]
        failed = engine.clone_voices(presets)
        if failed:
            raise Qwen3TTSError(f"voice {args.voice!r} could not be cloned: {failed[args.voice]}")
    catalog = VoiceCatalog(
        engine.speakers,
        engine.languages,
        presets,
        supports_instruct=engine.supports_instruct,
        model_type=kind,
        clones=engine.clone_prompts,
    )
    choice = catalog.resolve(SynthesizeVoice(name=args.voice) if args.voice else None)
    if language != AUTO:
        choice = replace(choice, language=language)
    if args.instruct:
        choice = replace(choice, instruct=args.instruct)
    return choice


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="%(levelname)s %(message)s")
    try:
        folder = voice_folder(args)
        options = EngineOptions(
            data_dir=args.data_dir,
            device=args.device,
            dtype=args.dtype,
            backend=args.backend,
            weights=args.weights,
            max_frames=args.max_frames or EngineOptions.max_frames,
            sampling=SamplingOverrides(greedy=args.greedy),
            max_streams=1,  # one request: no batching
            voice_cache_dir=folder / ".prompts" if folder is not None else None,
        )
        engine = Engine.from_pretrained(args.model, options)
        voice = choose_voice(engine, args)
        request = SynthesisRequest(
            text=args.text,
            speaker=voice.speaker,
            language=voice.language,
            instruct=voice.instruct,
            seed=args.seed,
            max_frames=args.max_frames,
            non_streaming_text=False if args.streaming_text else None,  # None: the voice's default, as the server
            clone=voice.clone,
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
        f"wrote {args.out}: voice {voice.voice}, {seconds:.2f} s of audio, {frames} frames, {elapsed:.2f} s "
        f"(first audio {0 if first_audio is None else first_audio * 1000:.0f} ms), RTF {rtf:.3f}, "
        f"backend {engine.info.backend} on {engine.info.device}/{engine.info.dtype}, {engine.info.weights} weights"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
