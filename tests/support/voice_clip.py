"""A reference clip for cloned voices in tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile


def write_clip(path: Path, seconds: float = 2.0, seed: int = 0) -> Path:
    """A voice-like test clip: a few harmonics with vibrato and noise, 16 kHz stereo (resampled and mixed down)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    f0 = 140 + 20 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000
    voice = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2 + rng.normal(0, 0.01, t.size)
    soundfile.write(str(path), np.stack([voice, 0.8 * voice], axis=1).astype(np.float32), 16000)
    return path
