"""Text, voice, language and instruct -> the Talker's prefill vectors and trailing text vectors.

One layout serves all three model types; only the voice differs. One vector of talker width per position:
  [instruct: Et(<|im_start|>user\\n{instruct}<|im_end|>\\n)]       CustomVoice 1.7B (style); VoiceDesign (the voice)
  role: Et(<|im_start|>assistant\\n)                                 3 positions
  control block: text track [PAD.., BOS] + codec track Ec(codec[:-1]), codec = prefill + [voice] + [pad, bos];
      the voice slot holds a preset speaker's row (CustomVoice), a clip's x-vector (Base), or nothing (VoiceDesign)
  then, text fed all at once ("non-streaming"):
      [Et(text), EOS] + Ec(pad) each, then PAD + Ec(bos); trailing = [PAD]
  or dual-track ("streaming" text feed): Et(t_1) + Ec(bos); trailing = [Et(t_2..t_N), EOS]
  or, cloning in context (Base with the clip's codes and transcript), text = [Et(transcript + text), EOS] and
  codec = [Ec(bos), Σ_g E_g(clip code g) per clip frame]:
      non-streaming: text + Ec(pad) each, then codec + PAD each; trailing = [PAD]
      streaming: text and codec added position by position over the codec's length (the shorter one padded
      with PAD); trailing = the text past the codec's length, or [PAD]
Each decode step adds trailing[k], or PAD once it runs out. Et = text embedding + projection; E_g = the embedding
table of code group g (the Talker's for group 0, the CodePredictor's for groups 1..15). The grouping of projections
and sums mirrors the reference so float32 results match bit for bit.

A prompt's *prefix* is its leading positions that the text does not touch: the instruct, the role, the control block
and, cloning in context, the positions of the clip's transcript. Attention is causal, so their K/V depend on nothing
after them: a voice's prefix is prefilled once and its K/V reused (model/prefix_cache.py). `PromptPrefix.key` names
those positions by what fixes them (the voice, the language, the instruct, the text feed), never by the text.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from ..errors import EmptyTextError, UnknownLanguageError, UnknownSpeakerError, VoiceError
from .config import Qwen3TTSConfig, voice_kind
from .lru import BoundedLru
from .talker import Qwen3TTSModel

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptPrefix:
    """The leading `length` positions of a prompt that only the voice fixes, and what fixes them (hashable)."""

    length: int
    key: tuple[object, ...]


@dataclass
class Prompt:
    embeds: Tensor  # [L, H] prefill inputs
    trailing: Tensor  # [M, H] added to the Talker input of decode steps 0..M-1
    pad: Tensor  # [H] added after the trailing vectors run out
    language_id: int | None  # the codec language id used (None: auto without dialect)
    # In-context cloning: the clip's codes [T, 16]. The generated speech continues them, so the codec decoder should
    # decode them first and drop their audio (CodecDecoder.new_stream(context=...)), as the reference does.
    codec_context: Tensor | None = None
    # The leading positions the text does not touch (always fewer than L: the text follows them).
    prefix: PromptPrefix | None = None

    @property
    def length(self) -> int:
        return int(self.embeds.shape[0])


@dataclass(frozen=True)
class ClonePrompt:
    """A cloned voice, as a Base model's prompt uses it (built once per voice by clone.VoiceCloner, cached on disk).

    x-vector mode: the speaker embedding alone. In-context mode adds the clip's codes and its tokenized transcript,
    which the Talker then continues: closer to the clip's voice and manner, at the cost of a longer prompt.
    """

    speaker_embedding: Tensor  # [H] float32: the clip's x-vector, in the voice slot of the control block
    ref_codes: Tensor | None = None  # [T, 16] int64: the clip's codec codes (in-context mode)
    ref_text_ids: list[int] | None = None  # chat_ref_text(transcript) tokenized (in-context mode)

    def __post_init__(self) -> None:
        if (self.ref_codes is None) != (self.ref_text_ids is None):
            raise ValueError("in-context cloning needs both the clip's codes and its transcript ids")
        if self.speaker_embedding.ndim != 1:
            raise ValueError(f"speaker_embedding must be one vector, got shape {tuple(self.speaker_embedding.shape)}")
        if self.ref_codes is not None and (self.ref_codes.ndim != 2 or self.ref_codes.shape[0] == 0):
            raise ValueError(f"ref_codes must be [frames, groups], got shape {tuple(self.ref_codes.shape)}")

    @property
    def in_context(self) -> bool:
        return self.ref_codes is not None

    @property
    def mode(self) -> str:
        return "in_context" if self.in_context else "x_vector"

    @cached_property
    def digest(self) -> str:
        """What the clone's prompt positions are made of, as a hash: a new clip under the same name gets another."""
        h = hashlib.sha256(self.speaker_embedding.detach().float().cpu().numpy().tobytes())
        if self.ref_codes is not None and self.ref_text_ids is not None:
            h.update(self.ref_codes.detach().to(torch.int64).cpu().numpy().tobytes())
            h.update(repr(self.ref_text_ids).encode())
        return h.hexdigest()


# A voice for build_prompt: a preset speaker's name (CustomVoice), a ClonePrompt (Base), or None (VoiceDesign: the
# instruct is the voice description).
Voice = str | ClonePrompt | None


def chat_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def chat_ref_text(text: str) -> str:
    """The transcript of a clone's reference clip, as the reference wraps it before tokenizing."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def chat_instruct(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def resolve_speaker(cfg: Qwen3TTSConfig, speaker: str) -> str:
    key = (speaker or "").strip().lower()
    if key not in cfg.talker.spk_id:
        raise UnknownSpeakerError(f"unknown speaker {speaker!r}; this model has: {', '.join(cfg.speakers)}")
    return key


def resolve_language(cfg: Qwen3TTSConfig, language: str | None, speaker: str | None) -> int | None:
    """The codec language id for a request, applying the dialect rule of preset speakers; None means no language
    tag. `speaker` is a resolved preset name, or None for a cloned or designed voice."""
    lang = (language or "auto").strip().lower()
    if lang != "auto" and (lang not in cfg.talker.codec_language_id or "dialect" in lang):
        raise UnknownLanguageError(f"unknown language {language!r}; this model speaks: {', '.join(cfg.languages)}")
    language_id = None if lang == "auto" else cfg.talker.codec_language_id[lang]
    # Dialect speakers (eric, dylan) speak their dialect when the language is chinese or auto.
    dialect = cfg.talker.spk_is_dialect.get(speaker, False) if speaker is not None else False
    if lang in ("chinese", "auto") and dialect:
        language_id = cfg.talker.codec_language_id[str(dialect).lower()]
    return language_id


def check_voice(cfg: Qwen3TTSConfig, voice: Voice) -> None:
    """Raise VoiceError unless this model type speaks this kind of voice."""
    if not isinstance(voice, (str, ClonePrompt, type(None))):
        raise VoiceError(f"a {cfg.model_type_name} model cannot speak a {type(voice).__name__}")
    kind = voice_kind(cloned=isinstance(voice, ClonePrompt), speaker=isinstance(voice, str))
    if kind == cfg.tts_model_type:
        return
    what = {
        "custom_voice": f"a preset speaker ({voice!r})",
        "base": "a cloned voice",
        "voice_design": "a designed voice (no speaker)",
    }[kind]
    needs = {
        "custom_voice": "one of its preset speakers",
        "base": "a cloned voice (a ClonePrompt)",
        "voice_design": "a voice description as instruct, and no speaker",
    }[cfg.tts_model_type]
    raise VoiceError(f"a {cfg.model_type_name} model cannot speak {what}; it needs {needs}")


@dataclass(frozen=True)
class PromptVoice:
    """A request's voice and language resolved against one model (resolve_voice), as prompt_for takes it."""

    preset: str | None  # a preset speaker's key in the checkpoint (CustomVoice)
    clone: ClonePrompt | None  # a cloned voice (Base)
    language_id: int | None  # the codec language id (None: auto without a dialect)


def resolve_voice(cfg: Qwen3TTSConfig, voice: Voice, language: str | None = "auto") -> PromptVoice:
    """Check the voice against the model type and resolve speaker and language once; raises VoiceError,
    UnknownSpeakerError or UnknownLanguageError."""
    check_voice(cfg, voice)
    preset = resolve_speaker(cfg, voice) if isinstance(voice, str) else None
    clone = voice if isinstance(voice, ClonePrompt) else None
    return PromptVoice(preset, clone, resolve_language(cfg, language, preset))


def build_prompt(
    model: Qwen3TTSModel,
    text_ids: list[int],
    speaker: Voice,
    language: str | None = "auto",
    instruct_ids: list[int] | None = None,
    *,
    non_streaming_text: bool = True,
) -> Prompt:
    """prompt_for with the voice and language resolved here: for callers that hold raw values (tools, tests)."""
    if len(text_ids) == 8 and text_ids[0] == model.cfg.im_start_token_id:
        raise EmptyTextError("text is empty")
    voice = resolve_voice(model.cfg, speaker, language)
    return prompt_for(model, text_ids, voice, instruct_ids, non_streaming_text=non_streaming_text)


@dataclass(frozen=True)
class VoiceParts:
    """The vectors of a prompt that no text touches, made once per voice (PromptParts) and reused: the leading
    positions (instruct, role, control block) and the rows the text's positions add to. Each is the output of the
    very call prompt_for would make, so a prompt built from them is bit for bit the one built without."""

    head: Tensor  # [P, H] the instruct (when instructed), the role and the control block, in order
    tts_pad: Tensor  # [1, H] Et(tts_pad)
    tts_eos: Tensor  # [1, H] Et(tts_eos)
    codec_bos: Tensor  # [1, H] Ec(codec_bos): the control block's last codec row, which a streaming text's first
    # position carries
    codec_pad: Tensor  # [1, H] Ec(codec_pad), added to each of a non-streaming text's positions
    pad_bos: Tensor  # [1, H] PAD + Ec(codec_bos): the position after a non-streaming text
    clip_codec: Tensor | None  # [T + 1, H] in-context cloning: Ec(bos) then the clip's frames, summed over groups

    @property
    def nbytes(self) -> int:
        tensors = [self.head, self.tts_pad, self.tts_eos, self.codec_bos, self.codec_pad, self.pad_bos]
        if self.clip_codec is not None:
            tensors.append(self.clip_codec)
        return sum(t.numel() * t.element_size() for t in tensors)


class PromptParts(BoundedLru[VoiceParts]):
    """VoiceParts by what fixes them (the voice, language, instruct and role ids), at most `max_entries` and
    `max_bytes` in all, least recently used dropped first. A request then computes only its text's vectors: a
    preset speaker's prompt drops from ~150 small GPU operations to ~20, which matters when a burst of requests
    builds its prompts at once. A voice that changes (a new clip under the same name) has a new key; the old entry
    is never hit again and ages out. Thread-safe."""

    def __init__(self, max_entries: int = 64, max_bytes: int = 64 << 20) -> None:
        super().__init__(max_bytes, lambda parts: parts.nbytes, max_entries)


def _voice_key(voice: PromptVoice) -> object:
    """The voice slot's content, hashable: a preset's name, a clone's digest and mode, or None (designed)."""
    if voice.preset is not None:
        return voice.preset
    return (voice.clone.digest, voice.clone.mode) if voice.clone is not None else None


def voice_parts(
    model: Qwen3TTSModel, voice: PromptVoice, instruct_ids: list[int] | None, role_ids: list[int]
) -> VoiceParts:
    """The text-independent vectors of a prompt (see the module doc for the layout they make)."""
    cfg = model.cfg
    tc = cfg.talker
    talker = model.talker
    device = model.device
    preset, clone, language_id = voice.preset, voice.clone, voice.language_id

    def ids(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    head: list[Tensor] = []
    if instruct_ids and cfg.supports_instruct:
        head.append(talker.embed_text(instruct_ids))

    special = talker.embed_text([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id])
    tts_bos, tts_eos, tts_pad = special[0:1], special[1:2], special[2:3]

    if language_id is None:
        prefill = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
    else:
        prefill = [tc.codec_think_id, tc.codec_think_bos_id, language_id, tc.codec_think_eos_id]
    tail = [tc.codec_pad_id, tc.codec_bos_id]
    if preset is not None:
        codec = talker.embed_codec(ids(prefill + [tc.spk_id[preset]] + tail))
    elif clone is not None:
        xvector = clone.speaker_embedding.to(device=device, dtype=model.dtype)[None]
        codec = torch.cat([talker.embed_codec(ids(prefill)), xvector, talker.embed_codec(ids(tail))], dim=0)
    else:
        codec = talker.embed_codec(ids(prefill + tail))

    head.append(talker.embed_text(role_ids))
    control_text = torch.cat([tts_pad.expand(codec.shape[0] - 2, -1), tts_bos], dim=0)
    head.append(control_text + codec[:-1])

    clip_codec = None
    if clone is not None and clone.in_context:
        assert clone.ref_codes is not None
        if clone.ref_codes.shape[1] != tc.num_code_groups:
            raise VoiceError(
                f"the clone's codes have {clone.ref_codes.shape[1]} groups; this model uses {tc.num_code_groups}"
            )
        codes = clone.ref_codes.to(device=device, dtype=torch.long)
        tables = [talker.model.codec_embedding, *talker.code_predictor.model.codec_embedding]
        frames = torch.stack([table(codes[:, g]) for g, table in enumerate(tables)], dim=1).sum(1)  # [T, H]
        clip_codec = torch.cat([talker.embed_codec(ids([tc.codec_bos_id])), frames], dim=0)
    return VoiceParts(
        head=torch.cat(head, dim=0),
        tts_pad=tts_pad,
        tts_eos=tts_eos,
        codec_bos=codec[-1:],
        codec_pad=talker.embed_codec(ids([tc.codec_pad_id])),
        pad_bos=tts_pad + talker.embed_codec(ids([tc.codec_bos_id])),
        clip_codec=clip_codec,
    )


@torch.inference_mode()
def prompt_for(
    model: Qwen3TTSModel,
    text_ids: list[int],
    voice: PromptVoice,
    instruct_ids: list[int] | None = None,
    *,
    non_streaming_text: bool = True,
    parts_cache: PromptParts | None = None,
) -> Prompt:
    """text_ids: the whole ChatML-wrapped text tokenized (chat_text), of a text with something to say; voice: the
    resolved voice, taken as given; instruct_ids: chat_instruct tokenized (for VoiceDesign, the voice description;
    may be None for a random voice); parts_cache: where the voice's text-independent vectors are kept between
    requests (None: made for this prompt alone).

    The reference's own defaults for non_streaming_text differ by API (True for CustomVoice and VoiceDesign, False
    for voice cloning); callers pick.
    """
    cfg = model.cfg
    talker = model.talker
    # The reference slices the tokenized ChatML by position: role = ids[:3], text = ids[3:-5].
    # Only the start is checked, so a checkpoint whose vocabulary lacks the merged "assistant"
    # token (the random writer's byte-level fallback) still builds a prompt of the right shape.
    if len(text_ids) < 8 or text_ids[0] != cfg.im_start_token_id:
        raise ValueError("text_ids must be the tokenized chat_text(text)")
    clone, language_id = voice.clone, voice.language_id
    instructed = bool(instruct_ids) and cfg.supports_instruct
    if instruct_ids and not instructed:
        _LOGGER.warning(
            "instruct is ignored: the %s %s model does not take one", cfg.tts_model_size, cfg.model_type_name
        )
    instruct_key = tuple(instruct_ids) if instructed and instruct_ids else ()
    role_ids = text_ids[:3]
    parts_key = (_voice_key(voice), language_id, instruct_key, tuple(role_ids))
    parts = parts_cache.get(parts_key) if parts_cache is not None else None
    if parts is None:
        parts = voice_parts(model, voice, instruct_ids if instructed else None, role_ids)
        if parts_cache is not None:
            parts_cache.put(parts_key, parts)
    tts_pad, tts_eos = parts.tts_pad, parts.tts_eos

    pieces = [parts.head]
    fixed = int(parts.head.shape[0])  # the positions before the text's
    body = text_ids[3:-5]
    if clone is not None and clone.in_context:
        icl, trailing = _in_context_part(model, clone, parts, body, non_streaming_text)
        pieces.append(icl)
        # The transcript's positions come first in either feed, and the clip's text and codes alone make them.
        assert clone.ref_text_ids is not None and clone.ref_codes is not None
        fixed += min(len(clone.ref_text_ids[3:-2]), clone.ref_codes.shape[0] + 1)
    elif non_streaming_text:
        text = torch.cat([talker.embed_text(body), tts_eos], dim=0)
        # Adding one embedding row broadcast is the same sum, element by element, as adding its lookups.
        pieces.append(text + parts.codec_pad)
        pieces.append(parts.pad_bos)
        trailing = tts_pad
    else:
        pieces.append(talker.embed_text(text_ids[3:4]) + parts.codec_bos)
        trailing = torch.cat([talker.embed_text(text_ids[4:-5]), tts_eos], dim=0)
    embeds = torch.cat(pieces, dim=0)
    key = (
        _voice_key(voice),
        language_id,
        instruct_key,
        non_streaming_text if clone is not None and clone.in_context else None,
    )
    length = min(fixed, int(embeds.shape[0]) - 1)  # at least the last position is prefilled per request
    return Prompt(
        embeds=embeds,
        trailing=trailing,
        pad=tts_pad[0],
        language_id=language_id,
        codec_context=clone.ref_codes if clone is not None and clone.in_context else None,
        prefix=PromptPrefix(length, key) if length > 0 else None,
    )


def _in_context_part(
    model: Qwen3TTSModel, clone: ClonePrompt, parts: VoiceParts, body: list[int], non_streaming: bool
) -> tuple[Tensor, Tensor]:
    """The positions after the control block when cloning in context, and the trailing text (see the module doc)."""
    talker = model.talker
    assert clone.ref_text_ids is not None and parts.clip_codec is not None
    tts_pad, codec = parts.tts_pad, parts.clip_codec
    # The reference slices the tokenized chat_ref_text by position: transcript = ids[3:-2]. The transcript and the
    # text go through the projection in one call, as the reference's do (a call's rows may round by its shape).
    transcript = clone.ref_text_ids[3:-2]
    text = talker.embed_text(transcript + body)
    text = torch.cat([text, parts.tts_eos], dim=0)

    n_text, n_codec = text.shape[0], codec.shape[0]
    if non_streaming:
        return torch.cat([text + parts.codec_pad, codec + tts_pad], dim=0), tts_pad
    if n_text > n_codec:
        return text[:n_codec] + codec, text[n_codec:]
    text = torch.cat([text, tts_pad.expand(n_codec - n_text, -1)], dim=0)
    return text + codec, tts_pad
