"""Text, speaker, language and instruct -> the Talker's prefill vectors and trailing text vectors.

Layout (CustomVoice), one vector of talker width per position:
  [instruct: Et(<|im_start|>user\\n{instruct}<|im_end|>\\n)]          (1.7B only)
  role: Et(<|im_start|>assistant\\n)                                    3 positions
  control block: text track [PAD.., BOS] + codec track Ec(codec[:-1]), codec = prefill + [speaker] + [pad, bos]
  then, text fed all at once ("non-streaming", the reference's default):
      [Et(text), EOS] + Ec(pad) each, then PAD + Ec(bos); trailing = [PAD]
  or dual-track ("streaming" text feed): Et(t_1) + Ec(bos); trailing = [Et(t_2..t_N), EOS]
Each decode step adds trailing[k], or PAD once it runs out. Et = text embedding + projection.
The grouping of projections mirrors the reference so float32 results match bit for bit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import EmptyTextError, UnknownLanguageError, UnknownSpeakerError
from .config import Qwen3TTSConfig
from .talker import Qwen3TTSModel

_LOGGER = logging.getLogger(__name__)


@dataclass
class Prompt:
    embeds: Tensor  # [L, H] prefill inputs
    trailing: Tensor  # [M, H] added to the Talker input of decode steps 0..M-1
    pad: Tensor  # [H] added after the trailing vectors run out
    language_id: int | None  # the codec language id used (None: auto without dialect)

    @property
    def length(self) -> int:
        return int(self.embeds.shape[0])


def chat_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def chat_instruct(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def resolve_speaker(cfg: Qwen3TTSConfig, speaker: str) -> str:
    key = (speaker or "").strip().lower()
    if key not in cfg.talker.spk_id:
        raise UnknownSpeakerError(f"unknown speaker {speaker!r}; this model has: {', '.join(cfg.speakers)}")
    return key


def resolve_language(cfg: Qwen3TTSConfig, language: str | None, speaker: str) -> int | None:
    """The codec language id for a request, applying the dialect rule; None means no language tag."""
    lang = (language or "auto").strip().lower()
    if lang != "auto" and (lang not in cfg.talker.codec_language_id or "dialect" in lang):
        raise UnknownLanguageError(f"unknown language {language!r}; this model speaks: {', '.join(cfg.languages)}")
    language_id = None if lang == "auto" else cfg.talker.codec_language_id[lang]
    # Dialect speakers (eric, dylan) speak their dialect when the language is chinese or auto.
    dialect = cfg.talker.spk_is_dialect.get(speaker, False)
    if lang in ("chinese", "auto") and dialect:
        language_id = cfg.talker.codec_language_id[str(dialect).lower()]
    return language_id


@torch.inference_mode()
def build_prompt(
    model: Qwen3TTSModel,
    text_ids: list[int],
    speaker: str,
    language: str | None = "auto",
    instruct_ids: list[int] | None = None,
    *,
    non_streaming_text: bool = True,
) -> Prompt:
    """text_ids: the whole ChatML-wrapped text tokenized (chat_text); instruct_ids: chat_instruct tokenized."""
    cfg = model.cfg
    tc = cfg.talker
    talker = model.talker
    device = model.device
    # The reference slices the tokenized ChatML by position: role = ids[:3], text = ids[3:-5].
    # Only the start is checked, so a checkpoint whose vocabulary lacks the merged "assistant"
    # token (the random writer's byte-level fallback) still builds a prompt of the right shape.
    if len(text_ids) < 8 or text_ids[0] != cfg.im_start_token_id:
        raise ValueError("text_ids must be the tokenized chat_text(text)")
    if len(text_ids) == 8:
        raise EmptyTextError("text is empty")
    speaker = resolve_speaker(cfg, speaker)
    language_id = resolve_language(cfg, language, speaker)

    def ids(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    parts: list[Tensor] = []
    if instruct_ids:
        if cfg.supports_instruct:
            parts.append(talker.embed_text(ids(instruct_ids)))
        else:
            _LOGGER.warning("instruct is ignored: the 0.6B CustomVoice model does not support it")

    special = talker.embed_text(ids([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]))
    tts_bos, tts_eos, tts_pad = special[0:1], special[1:2], special[2:3]

    if language_id is None:
        prefill = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
    else:
        prefill = [tc.codec_think_id, tc.codec_think_bos_id, language_id, tc.codec_think_eos_id]
    codec = talker.embed_codec(ids(prefill + [tc.spk_id[speaker], tc.codec_pad_id, tc.codec_bos_id]))

    parts.append(talker.embed_text(ids(text_ids[:3])))  # role
    control_text = torch.cat([tts_pad.expand(codec.shape[0] - 2, -1), tts_bos], dim=0)
    parts.append(control_text + codec[:-1])

    body = text_ids[3:-5]
    if non_streaming_text:
        text = torch.cat([talker.embed_text(ids(body)), tts_eos], dim=0)
        parts.append(text + talker.embed_codec(ids([tc.codec_pad_id] * (len(body) + 1))))
        parts.append(tts_pad + talker.embed_codec(ids([tc.codec_bos_id])))
        trailing = tts_pad
    else:
        parts.append(talker.embed_text(ids(text_ids[3:4])) + codec[-1:])
        trailing = torch.cat([talker.embed_text(ids(text_ids[4:-5])), tts_eos], dim=0)
    return Prompt(embeds=torch.cat(parts, dim=0), trailing=trailing, pad=tts_pad[0], language_id=language_id)
