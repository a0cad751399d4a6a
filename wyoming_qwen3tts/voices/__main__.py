"""`python -m wyoming_qwen3tts.voices`: add, list and remove the cloned voices of a voices folder.

    python -m wyoming_qwen3tts.voices add anna --audio clip.wav --text "What Anna says in the clip." --model BASE
    python -m wyoming_qwen3tts.voices list
    python -m wyoming_qwen3tts.voices remove anna
    python -m wyoming_qwen3tts.voices design narrator --description "A calm, deep narrator." \
        --text "A sample sentence, said in the designed voice." --model VOICEDESIGN --base-model BASE

The folder is the server's (`--voices-dir`, else DATA_DIR/voices; `--data-dir` as the server takes it). `add`
checks the clip (readable audio, 1-30 s, not silent), stores it as NAME.wav (mono float, at the clip's own rate:
cloning from it equals cloning from the clip) with NAME.txt and NAME.toml beside it, and with `--model` also clones it now with that Base model, so the prompt is cached and
the server's next start does not compute it. `design` renders the sample sentence with a VoiceDesign model and
adds that audio as a cloned voice: a designed voice then stays the same voice in every sentence (a plain design
voice is made up anew for each). The server picks up changes at its next start.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import DEFAULT_LANGUAGES, VoiceCatalog, VoicePreset, check_voice_name, scan_voice_folder
from .folder import commit_voice, remove_voice, store_voice, voice_exists


def _folder(args: argparse.Namespace) -> Path:
    if args.voices_dir is not None:
        return args.voices_dir
    if args.data_dir is not None:
        return args.data_dir / "voices"
    raise SystemExit("error: name the voices folder with --voices-dir DIR (or --data-dir DIR, whose voices/ it is)")


def _check_name(name: str) -> None:
    try:
        check_voice_name(name)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None


def _clone_now(model: str, data_dir: Path | None, folder: Path, preset: VoicePreset) -> None:
    from ..engine import Engine, EngineOptions

    if preset.reference_audio is None:  # store_voice's presets always name their clip
        raise ValueError(f"voice {preset.name!r} has no reference clip to clone")
    engine = Engine.from_pretrained(
        model, EngineOptions(data_dir=data_dir, voice_cache_dir=folder / ".prompts", max_streams=1)
    )
    prompt = engine.clone_voice(preset.reference_audio, preset.reference_text, x_vector_only=preset.x_vector_only)
    mode = (
        "from the voice alone (x-vector)"
        if prompt.ref_codes is None
        else f"in context ({len(prompt.ref_codes)} clip frames)"
    )
    print(f"cloned {preset.name!r} with {model}, {mode}; the prompt is cached in {folder / '.prompts'}")


def cmd_add(args: argparse.Namespace) -> int:
    from ..errors import Qwen3TTSError
    from ..model.reference_audio import read_mono, reference_audio_from_array

    folder = _folder(args)
    _check_name(args.name)
    if voice_exists(folder, args.name) and not args.replace:
        raise SystemExit(f"error: a voice {args.name!r} exists in {folder}; remove it first or give --replace")
    if not args.text and not args.x_vector_only:
        raise SystemExit("error: give the clip's transcript with --text (best likeness), or --x-vector-only")
    try:
        mono, rate, name = read_mono(args.audio)
        audio = reference_audio_from_array(mono, rate, source=name)
    except Qwen3TTSError as err:
        raise SystemExit(f"error: {err}") from None
    if args.replace:
        remove_voice(folder, args.name)
    preset = store_voice(
        folder,
        args.name,
        mono,
        rate,
        args.text,
        x_vector_only=args.x_vector_only,
        language=args.language,
        description=args.description,
    )
    if args.model:
        try:
            _clone_now(args.model, args.data_dir, folder, preset)
        except BaseException as err:
            remove_voice(folder, args.name)
            if isinstance(err, Qwen3TTSError):
                raise SystemExit(f"error: {err} (the voice was not added)") from None
            raise
    commit_voice(folder, args.name)
    print(f"added {args.name!r}: {preset.reference_audio} ({audio.seconds:.1f} s)")
    _show(preset)
    return 0


def _show(preset: VoicePreset) -> None:
    catalog = VoiceCatalog([], DEFAULT_LANGUAGES, [preset], model_type=None)
    (voice,) = catalog.tts_voices()
    print(
        f"Home Assistant will show: {voice.name} - {voice.description} (languages: {', '.join(voice.languages) or 'all'})"
    )


def cmd_list(args: argparse.Namespace) -> int:
    folder = _folder(args)
    voices, problems = scan_voice_folder(folder)
    for voice in voices:
        mode = "x-vector" if voice.x_vector_only else ("in context" if voice.reference_text else "no transcript!")
        print(
            f"{voice.name}\t{voice.reference_audio.name if voice.reference_audio else ''}\t{mode}"
            f"\t{voice.language or 'auto'}\t{voice.description or ''}"
        )
    for problem in problems:
        print(problem, file=sys.stderr)
    if not voices and not problems:
        print(f"no voices in {folder}", file=sys.stderr)
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    folder = _folder(args)
    _check_name(args.name)
    removed = remove_voice(folder, args.name)
    if not removed:
        raise SystemExit(f"error: no voice {args.name!r} in {folder}")
    print(f"removed {args.name!r}: {', '.join(p.name for p in removed)} (the server drops it at its next start)")
    return 0


def cmd_design(args: argparse.Namespace) -> int:
    import numpy as np

    from ..engine import Engine, EngineOptions
    from ..errors import Qwen3TTSError
    from ..model.reference_audio import reference_audio_from_array
    from ..request import SAMPLE_RATE, SynthesisRequest

    folder = _folder(args)
    _check_name(args.name)
    if voice_exists(folder, args.name):
        raise SystemExit(f"error: a voice {args.name!r} exists in {folder}; remove it first")
    try:
        designer = Engine.from_pretrained(args.model, EngineOptions(data_dir=args.data_dir, max_streams=1))
        if designer.model_type != "voice_design":
            raise SystemExit(
                f"error: --model must be a VoiceDesign model; {args.model} is {designer.config.model_type_name}"
            )
        request = SynthesisRequest(
            text=args.text, speaker="", language=args.language or "auto", instruct=args.description, seed=args.seed
        )
        pcm, _ = designer.synthesize_all(request)
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        audio = reference_audio_from_array(samples, SAMPLE_RATE, source=f"the {args.name!r} sample")
    except Qwen3TTSError as err:
        raise SystemExit(f"error: {err}") from None
    preset = store_voice(
        folder, args.name, audio.samples, SAMPLE_RATE, args.text, language=args.language, description=args.description
    )
    commit_voice(folder, args.name)
    print(f"designed {args.name!r}: {audio.seconds:.1f} s sample saved as {preset.reference_audio}")
    if args.base_model:
        try:
            _clone_now(args.base_model, args.data_dir, folder, preset)
        except Qwen3TTSError as err:
            raise SystemExit(f"error: {err}") from None
    _show(preset)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wyoming_qwen3tts.voices", description=__doc__.split("\n\n")[0])
    parser.add_argument("--voices-dir", type=Path, default=None, help="the voices folder (default: DATA_DIR/voices)")
    parser.add_argument("--data-dir", type=Path, default=None, help="the server's data dir (models, and voices/)")
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="add a cloned voice from a clip")
    add.add_argument("name")
    add.add_argument("--audio", type=Path, required=True, help="the clip: WAV, FLAC, OGG or MP3, 1-30 s")
    add.add_argument("--text", default=None, help="what is said in the clip (in-context cloning)")
    add.add_argument("--x-vector-only", action="store_true", help="clone from the voice alone (no transcript)")
    add.add_argument("--language", default=None, help="the voice's language (code or name); default: detected")
    add.add_argument("--description", default=None, help="what Home Assistant shows")
    add.add_argument("--model", default=None, help="a Base model to clone with now (the prompt is cached)")
    add.add_argument("--replace", action="store_true", help="replace a voice of that name")
    add.set_defaults(run=cmd_add)
    lst = sub.add_parser("list", help="list the folder's voices")
    lst.set_defaults(run=cmd_list)
    rm = sub.add_parser("remove", help="remove a voice")
    rm.add_argument("name")
    rm.set_defaults(run=cmd_remove)
    design = sub.add_parser("design", help="render a sample with VoiceDesign and keep it as a cloned voice")
    design.add_argument("name")
    design.add_argument("--description", required=True, help="the voice, in words")
    design.add_argument("--text", required=True, help="the sample sentence (a few seconds of speech)")
    design.add_argument("--model", default="Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign", help="the VoiceDesign model")
    design.add_argument("--base-model", default=None, help="a Base model to clone the sample with now")
    design.add_argument("--language", default=None)
    design.add_argument("--seed", type=int, default=0)
    design.set_defaults(run=cmd_design)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
