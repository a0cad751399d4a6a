"""Clone prompts on disk, so that a restart does not run the speaker and codec encoders again for every voice.

One safetensors file per prompt, named by a hash of everything the prompt depends on: the model's encoders and
tokenizer (model identity), the clip's samples, the mode, and for in-context cloning the transcript. The key is also
kept in the file's metadata and checked on reading, so a renamed or foreign file is never used. Files are
written to a temporary name and renamed, so a crash leaves no half-written prompt behind; a file that cannot be read
is ignored (and recomputed by the caller).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .prompt import ClonePrompt

_LOG = logging.getLogger(__name__)

FORMAT = "wyoming-qwen3tts clone prompt 1"


def cache_key(model_identity: str, audio_sha256: str, x_vector_only: bool, transcript: str | None) -> str:
    """The file stem of a prompt: what it was computed from, hashed (the transcript only matters in context)."""
    parts = [FORMAT, model_identity, audio_sha256, "x_vector" if x_vector_only else "in_context"]
    if not x_vector_only:
        parts.append(transcript or "")
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()[:40]


class ClonePromptCache:
    """A directory of cached clone prompts (created on first write)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.safetensors"

    def load(self, key: str) -> ClonePrompt | None:
        """The prompt stored under key, or None when there is none or it cannot be used."""
        file = self.path(key)
        if not file.is_file():
            return None
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                meta = f.metadata() or {}
                if meta.get("format") != FORMAT or meta.get("key") != key:
                    raise ValueError(f"metadata {meta!r} does not belong to key {key}")
                names = set(f.keys())
                embedding = f.get_tensor("speaker_embedding")
                codes = f.get_tensor("ref_codes") if "ref_codes" in names else None
                text_ids = f.get_tensor("ref_text_ids").tolist() if "ref_text_ids" in names else None
            return ClonePrompt(speaker_embedding=embedding, ref_codes=codes, ref_text_ids=text_ids)
        except Exception as err:  # a damaged file raises anything from safetensors' parser to our own check
            _LOG.warning("ignoring the cached clone prompt %s: %s", file, err)
            return None

    def store(self, key: str, prompt: ClonePrompt) -> Path:
        tensors = {"speaker_embedding": prompt.speaker_embedding.detach().float().cpu().contiguous()}
        if prompt.ref_codes is not None and prompt.ref_text_ids is not None:
            tensors["ref_codes"] = prompt.ref_codes.detach().to(torch.int64).cpu().contiguous()
            tensors["ref_text_ids"] = torch.tensor(prompt.ref_text_ids, dtype=torch.int64)
        self.directory.mkdir(parents=True, exist_ok=True)
        file = self.path(key)
        tmp = file.with_name(f"{file.name}.{os.getpid()}.partial")
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "key": key, "mode": prompt.mode})
        tmp.replace(file)
        return file
