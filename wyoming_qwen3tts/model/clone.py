"""Voice cloning with a Base model: a reference clip (and its transcript) -> a ClonePrompt, once per voice.

What the reference's create_voice_clone_prompt computes, from our own modules: the clip's x-vector (speaker_encoder),
and for in-context cloning also the clip's codec codes (codec_encoder) and its tokenized transcript. With a cache
directory, prompts are kept on disk (clone_cache), so a restart finds them without running the encoders.

    cloner = VoiceCloner.from_checkpoint(ckpt, tokenizer, cache_dir=data_dir / "voices" / ".prompts")
    voice = cloner.clone(read_reference_audio("anna.wav"), "Transcript of the clip.")
    prompt = build_prompt(model, tokenizer.encode(chat_text(text)), voice, "english", non_streaming_text=False)
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import VoiceError
from .checkpoint import Checkpoint
from .clone_cache import ClonePromptCache, cache_key
from .codec_encoder import CodecEncoder
from .prompt import ClonePrompt, chat_ref_text
from .reference_audio import ReferenceAudio
from .speaker_encoder import SpeakerEncoder
from .tokenizer import TextTokenizer

_LOG = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")


def model_identity(ckpt: Checkpoint) -> str:
    """A hash of everything a clone prompt depends on: the encoders' configs and weights and the tokenizer files.

    The Talker's weights are left out on purpose: they do not enter the prompt, so a prompt stays valid for any
    Talker that shares these encoders. Hashing about 250 MB of weights takes a fraction of a second, once per model.
    """
    h = hashlib.sha256(b"clone prompt inputs 1\0")
    h.update(repr((ckpt.config.speaker_encoder, ckpt.codec_encoder_config)).encode())
    for tensors in (ckpt.speaker_encoder_tensors, ckpt.codec_encoder_tensors):
        for name in sorted(tensors):
            t = tensors[name].detach().cpu().contiguous()
            h.update(f"\0{name}:{t.dtype}:{tuple(t.shape)}\0".encode())
            h.update(t.view(torch.uint8).numpy().data)
    for name in _TOKENIZER_FILES:
        file = Path(ckpt.path) / name
        if file.is_file():
            h.update(f"\0{name}\0".encode())
            h.update(file.read_bytes())
    return h.hexdigest()


@dataclass
class VoiceCloner:
    """Builds ClonePrompts for one Base model. Not thread-safe: serialise calls (they run whole networks)."""

    speaker_encoder: SpeakerEncoder
    codec_encoder: CodecEncoder
    tokenizer: TextTokenizer
    identity: str  # model_identity() of the checkpoint the encoders come from
    cache: ClonePromptCache | None = None

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: Checkpoint,
        tokenizer: TextTokenizer,
        *,
        cache_dir: Path | str | None = None,
        device: str | torch.device = "cpu",
    ) -> VoiceCloner:
        """From a Base checkpoint loaded with its clone encoders (load_checkpoint(..., model_types=("base",)))."""
        cfg = ckpt.config
        if cfg.tts_model_type != "base" or cfg.speaker_encoder is None:
            raise VoiceError(f"{ckpt.path} is a {cfg.model_type_name} model; voices are cloned with a Base model")
        if not ckpt.speaker_encoder_tensors or not ckpt.codec_encoder_tensors or ckpt.codec_encoder_config is None:
            raise VoiceError(f"{ckpt.path} was loaded without its clone encoders (load_checkpoint clone_encoders=True)")
        return cls(
            SpeakerEncoder.from_tensors(cfg.speaker_encoder, ckpt.speaker_encoder_tensors, device=device),
            CodecEncoder.from_tensors(ckpt.codec_encoder_config, ckpt.codec_encoder_tensors, device=device),
            tokenizer,
            model_identity(ckpt),
            ClonePromptCache(cache_dir) if cache_dir is not None else None,
        )

    def clone(
        self, audio: ReferenceAudio, transcript: str | None = None, *, x_vector_only: bool = False
    ) -> ClonePrompt:
        """The prompt of a voice: from the cache when it holds one for this model, clip, mode and transcript.

        x_vector_only=False (in-context cloning, the better likeness) needs the clip's transcript; raises VoiceError
        without one.
        """
        text = (transcript or "").strip()
        if not x_vector_only and not text:
            raise VoiceError(
                f"cloning from {audio.source} in context needs the transcript of the clip (what is said in it); "
                "give it, or clone from the voice alone (x-vector only)"
            )
        key = cache_key(self.identity, audio.sha256, x_vector_only, text)
        if self.cache is not None:
            cached = self.cache.load(key)
            if cached is not None:
                return cached
        prompt = self.compute(audio, None if x_vector_only else text)
        if self.cache is not None:
            try:
                self.cache.store(key, prompt)
            except OSError as err:  # a read-only or full disk costs the next restart a recomputation, nothing more
                _LOG.warning("could not cache the clone prompt of %s: %s", audio.source, err)
        return prompt

    def compute(self, audio: ReferenceAudio, transcript: str | None) -> ClonePrompt:
        """Run the encoders: x-vector only when transcript is None, in context otherwise."""
        embedding = self.speaker_encoder.embed(audio.samples).cpu()
        if transcript is None:
            return ClonePrompt(speaker_embedding=embedding)
        return ClonePrompt(
            speaker_embedding=embedding,
            ref_codes=self.codec_encoder.encode(audio.samples),
            ref_text_ids=self.tokenizer.encode(chat_ref_text(transcript)),
        )
