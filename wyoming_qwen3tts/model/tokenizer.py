"""Qwen's byte-level BPE text tokenizer, built on the `tokenizers` library (no transformers at runtime).

It reproduces Qwen's own tokenization (tiktoken with ``qwen.tiktoken``, which is also what Qwen2TokenizerFast
does when it keeps Qwen's split regex): NFC normalisation, Qwen2's split regex, byte-level mapping without a
prefix space, byte-level BPE, byte-level decoding.  Added tokens (``<|im_start|>``, ``<tts_pad>``, ...) are
recognised inside the text at their ids, and no BOS/EOS is added.

Deliberate difference: the reference (qwen-tts 0.1.1 under transformers 4.57.3) may swap in a "fixed Mistral"
regex when it loads a local checkpoint directory, which splits camelCase words ("iPhone") differently.  We
follow Qwen's regex, as the reference does when it loads by hub id; tests/model/test_tokenizer.py pins the gap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from wyoming_qwen3tts.errors import ModelLoadError

# Qwen2's pre-tokenizer split pattern (the same as tiktoken's qwen PAT_STR).  Not the "fixed Mistral" one.
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TOKENIZER_JSON = "tokenizer.json"
VOCAB_JSON = "vocab.json"
MERGES_TXT = "merges.txt"
TOKENIZER_CONFIG_JSON = "tokenizer_config.json"


class TokenizerLoadError(ModelLoadError, ValueError):
    """The tokenizer files are missing or malformed; the message names the file."""


class TextTokenizer:
    """Text <-> Qwen token ids.  Thread-safe for encode/decode (the Rust tokenizer holds no per-call state)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        """Load from a checkpoint directory.

        Uses ``tokenizer.json`` when present; otherwise builds the tokenizer from ``vocab.json`` +
        ``merges.txt`` and the added tokens in ``tokenizer_config.json`` (the release's layout).
        Raises TokenizerLoadError naming the first missing or unreadable file.
        """
        root = Path(path)
        if not root.is_dir():
            raise TokenizerLoadError(f"tokenizer directory not found: {root}")
        tokenizer_json = root / TOKENIZER_JSON
        if tokenizer_json.is_file():
            try:
                return cls(Tokenizer.from_file(str(tokenizer_json)))
            except Exception as exc:  # the Rust side raises plain Exception on parse errors
                raise TokenizerLoadError(f"cannot read {tokenizer_json}: {exc}") from exc
        return cls(_build_from_vocab_files(root))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; added tokens written in the text become their ids.  Nothing is prepended."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; bytes that do not form valid UTF-8 become U+FFFD, as Qwen's errors="replace"."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int:
        """The id of one vocabulary or added token, e.g. ``"<|im_start|>"`` -> 151644."""
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise KeyError(f"token {token!r} is not in the tokenizer's vocabulary")
        return token_id

    @property
    def vocab_size(self) -> int:
        """Number of entries (BPE tokens plus added tokens)."""
        return self._tok.get_vocab_size(with_added_tokens=True)


def _read_json(path: Path) -> object:
    if not path.is_file():
        raise TokenizerLoadError(f"tokenizer file missing: {path} (and no {TOKENIZER_JSON} either)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerLoadError(f"cannot read {path}: {exc}") from exc


def _read_merges(path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        raise TokenizerLoadError(f"tokenizer file missing: {path} (and no {TOKENIZER_JSON} either)")
    merges: list[tuple[str, str]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerLoadError(f"cannot read {path}: {exc}") from exc
    for number, line in enumerate(lines, start=1):
        # The first line is a "#version: 0.2" header; byte-level symbols never contain spaces or start a line
        # with "#version", so the split below is unambiguous.
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise TokenizerLoadError(f"{path}:{number}: expected two symbols, got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


def _added_tokens(config: object, path: Path) -> list[tuple[int, str, bool]]:
    """(id, content, special) for every entry of tokenizer_config.json's added_tokens_decoder, by id."""
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    if not isinstance(decoder, dict):
        raise TokenizerLoadError(f"{path} has no added_tokens_decoder")
    out: list[tuple[int, str, bool]] = []
    for key, entry in decoder.items():
        try:
            out.append((int(key), str(entry["content"]), bool(entry.get("special", True))))
        except (ValueError, TypeError, KeyError) as exc:
            raise TokenizerLoadError(f"{path}: bad added_tokens_decoder entry {key!r}: {exc}") from exc
    return sorted(out)


def _build_from_vocab_files(root: Path) -> Tokenizer:
    vocab_path = root / VOCAB_JSON
    vocab = _read_json(vocab_path)
    if not isinstance(vocab, dict):
        raise TokenizerLoadError(f"{vocab_path} is not a JSON object of token -> id")
    merges = _read_merges(root / MERGES_TXT)
    config_path = root / TOKENIZER_CONFIG_JSON
    added = _added_tokens(_read_json(config_path), config_path)

    # Put the added tokens into the BPE vocabulary at their configured ids.  The `tokenizers` library gives a
    # new added token the next free id after the model vocabulary, which is only right when the ids happen to
    # be contiguous with it; registering them in the model first makes add_tokens reuse the configured id.
    # BPE can never produce them itself: no merge leads to their strings, and they are split out before BPE.
    if not all(isinstance(i, int) for i in vocab.values()):
        raise TokenizerLoadError(f"{vocab_path} maps a token to something other than an integer id")
    taken = {i: tok for tok, i in vocab.items()}
    for token_id, content, _special in added:
        holder = taken.get(token_id)
        if holder is not None and holder != content:
            raise TokenizerLoadError(
                f"{config_path}: id {token_id} is {content!r} but {vocab_path} gives it to {holder!r}"
            )
        vocab[content] = token_id
        taken[token_id] = content

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    # normalized=False: added tokens match the raw text, before NFC, as in Qwen's tokenizer_config.
    specials = [AddedToken(c, special=True, normalized=False) for _i, c, s in added if s]
    plain = [AddedToken(c, special=False, normalized=False) for _i, c, s in added if not s]
    tok.add_special_tokens(specials)
    tok.add_tokens(plain)
    for token_id, content, _special in added:
        if tok.token_to_id(content) != token_id:
            raise TokenizerLoadError(f"{config_path}: added token {content!r} did not get id {token_id}")
    return tok
