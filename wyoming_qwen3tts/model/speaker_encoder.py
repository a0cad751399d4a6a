"""The Base model's speaker encoder: a 24 kHz clip -> log-mel features -> ECAPA-TDNN -> one x-vector [enc_dim].

The x-vector takes the preset speaker's place in the Talker's prompt (prompt.py), so a clone speaks in the voice of
the clip. Read top to bottom: the Slaney mel filterbank, the log-mel features, then the network:

  TDNN (conv k=5) -> 3 x SE-Res2Net blocks (dilations 2, 3, 4) -> multi-layer aggregation (their outputs joined,
  conv k=1) -> attentive statistics pooling (a weighted mean and std over time) -> conv k=1 to enc_dim.

Every conv pads 'same' by reflection, as the reference's layers do. The features are computed exactly as the
reference computes them (reflect-padded STFT, magnitude with +1e-9 under the root, log of the mel energies clamped at
1e-5), so float32 embeddings agree with the reference to rounding. The encoder runs once per voice and always in
float32, whatever dtype the Talker uses; the prompt casts the x-vector to the Talker's dtype.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .config import SpeakerEncoderConfig
from .weights import NamedWeights

SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
N_MELS = 128
F_MAX = 12000.0

_PREFIX = "speaker_encoder."


# --------------------------------------------------------------------------------------------------------------------
# Features
# --------------------------------------------------------------------------------------------------------------------

# Slaney's mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above (a factor 6.4 every 27 mels).
_HZ_PER_MEL = 200.0 / 3
_LOG_START_HZ = 1000.0
_LOG_START_MEL = _LOG_START_HZ / _HZ_PER_MEL
_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    if hz < _LOG_START_HZ:
        return hz / _HZ_PER_MEL
    return _LOG_START_MEL + float(np.log(hz / _LOG_START_HZ)) / _LOG_STEP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    hz = _HZ_PER_MEL * mels
    log_part = mels >= _LOG_START_MEL
    hz[log_part] = _LOG_START_HZ * np.exp(_LOG_STEP * (mels[log_part] - _LOG_START_MEL))
    return hz


def mel_filterbank(
    sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS, f_min: float = 0.0, f_max: float = F_MAX
) -> np.ndarray:
    """Triangular filters [n_mels, n_fft // 2 + 1] on Slaney's mel scale, each scaled to unit area ("slaney" norm).

    float64 arithmetic, float32 result: the values librosa.filters.mel gives for the same arguments, which is what
    the reference multiplies its spectrogram with (tests/test_speaker_encoder.py holds the two side by side).
    """
    bin_hz = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    # n_mels + 2 band edges: filter i rises from edge i to edge i+1 and falls to edge i+2.
    edges = _mel_to_hz(np.linspace(_hz_to_mel(f_min), _hz_to_mel(f_max), n_mels + 2))
    widths = np.diff(edges)
    distance = np.subtract.outer(edges, bin_hz)  # [n_mels + 2, bins]: edge minus bin frequency
    rising = -distance[:-2] / widths[:-1, None]
    falling = distance[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(rising, falling)).astype(np.float32)
    area = 2.0 / (edges[2:] - edges[:-2])
    return (weights * area[:, None]).astype(np.float32)


def log_mel_spectrogram(wav: Tensor) -> Tensor:
    """wav [n] float32 at 24 kHz, n > 384 -> log-mel features [frames, 128], frames = (n + 768 - 1024) // 256 + 1."""
    pad = (N_FFT - HOP) // 2
    # [1, 1, n] for F.pad's reflect mode; the batch of one is kept through the STFT as in the reference.
    x = F.pad(wav.float()[None, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(
        x,
        N_FFT,
        hop_length=HOP,
        win_length=N_FFT,
        window=torch.hann_window(N_FFT, device=x.device),
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    basis = torch.from_numpy(mel_filterbank()).to(x.device)
    mel = torch.matmul(basis, magnitude)  # [1, 128, frames]
    return torch.log(torch.clamp(mel, min=1e-5))[0].transpose(0, 1)


# --------------------------------------------------------------------------------------------------------------------
# Layers (plain tensors + functional ops)
# --------------------------------------------------------------------------------------------------------------------


class _Conv:
    """Conv1d padded 'same' by reflection (left gets the smaller half), optionally followed by ReLU (a TDNN layer)."""

    def __init__(self, w: NamedWeights, name: str, cout: int, cin: int, k: int, dilation: int = 1, relu: bool = True):
        self.weight = w(name + ".weight", (cout, cin, k))
        self.bias = w(name + ".bias", (cout,))
        self.dilation, self.relu = dilation, relu
        total = dilation * (k - 1)
        self.pad = (total // 2, total - total // 2)

    def __call__(self, x: Tensor) -> Tensor:
        if self.pad != (0, 0):
            x = F.pad(x, self.pad, mode="reflect")
        y = F.conv1d(x, self.weight, self.bias, dilation=self.dilation)
        return F.relu(y) if self.relu else y


class _SERes2NetBlock:
    """TDNN k=1 -> Res2Net (channel groups, each conv also sees the previous group's output) -> TDNN k=1 ->
    squeeze-excitation (channel gates from the time mean), plus the input."""

    def __init__(self, w: NamedWeights, p: str, cin: int, cout: int, k: int, dilation: int, cfg: SpeakerEncoderConfig):
        self.scale = cfg.enc_res2net_scale
        width = cout // self.scale
        self.tdnn1 = _Conv(w, p + "tdnn1.conv", cout, cin, 1)
        self.groups = [
            _Conv(w, p + f"res2net_block.blocks.{j}.conv", width, width, k, dilation) for j in range(self.scale - 1)
        ]
        self.tdnn2 = _Conv(w, p + "tdnn2.conv", cout, cout, 1)
        se = cfg.enc_se_channels
        self.squeeze = _Conv(w, p + "se_block.conv1", se, cout, 1)
        self.excite = _Conv(w, p + "se_block.conv2", cout, se, 1, relu=False)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.tdnn1(x)
        parts = torch.chunk(h, self.scale, dim=1)
        out = [parts[0]]  # the first group passes through
        for j, conv in enumerate(self.groups):
            out.append(conv(parts[j + 1] if j == 0 else parts[j + 1] + out[-1]))
        h = self.tdnn2(torch.cat(out, dim=1))
        gate = torch.sigmoid(self.excite(self.squeeze(h.mean(dim=2, keepdim=True))))
        return h * gate + x


def _weighted_stats(x: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and std over time of x [1, C, T] under weights summing to 1 over T (std floored at 1e-6)."""
    mean = (weights * x).sum(2)
    std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
    return mean, std


class _AttentiveStatsPooling:
    """Per channel, the mean and std over time under softmax attention weights; the attention sees each frame and
    the clip's global (uniformly weighted) mean and std. [1, C, T] -> [1, 2C]."""

    def __init__(self, w: NamedWeights, channels: int, attention_channels: int) -> None:
        self.tdnn = _Conv(w, "asp.tdnn.conv", attention_channels, 3 * channels, 1)
        self.conv = _Conv(w, "asp.conv", channels, attention_channels, 1, relu=False)

    def __call__(self, x: Tensor) -> Tensor:
        t = x.shape[-1]
        uniform = torch.ones(1, 1, t, dtype=x.dtype, device=x.device) / t
        mean, std = _weighted_stats(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)], dim=1)
        attention = F.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_stats(x, attention)
        return torch.cat([mean, std], dim=1)


# --------------------------------------------------------------------------------------------------------------------
# The encoder
# --------------------------------------------------------------------------------------------------------------------


class SpeakerEncoder:
    """ECAPA-TDNN speaker encoder of a Base checkpoint (inference only, float32). Build with `from_tensors`."""

    def __init__(self, cfg: SpeakerEncoderConfig, w: NamedWeights) -> None:
        self.cfg = cfg
        self.device = w.device
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        self.first = _Conv(w, "blocks.0.conv", ch[0], cfg.mel_dim, ks[0], dil[0])
        self.blocks = [
            _SERes2NetBlock(w, f"blocks.{i}.", ch[i - 1], ch[i], ks[i], dil[i], cfg) for i in range(1, len(ch) - 1)
        ]
        self.aggregate = _Conv(w, "mfa.conv", ch[-1], ch[-1], ks[-1], dil[-1])
        self.pool = _AttentiveStatsPooling(w, ch[-1], cfg.enc_attention_channels)
        self.fc = _Conv(w, "fc", cfg.enc_dim, 2 * ch[-1], 1, relu=False)

    @classmethod
    def from_tensors(
        cls, cfg: SpeakerEncoderConfig, tensors: dict[str, Tensor], *, device: str | torch.device = "cpu"
    ) -> SpeakerEncoder:
        """Build from `speaker_encoder.*` tensors (original key names, any dtype). Raises ModelLoadError naming every
        missing or misshapen tensor."""
        w = NamedWeights(tensors, torch.float32, torch.device(device), prefix=_PREFIX, what="speaker encoder")
        encoder = cls(cfg, w)
        w.check()
        return encoder

    @torch.inference_mode()
    def embed_features(self, mels: Tensor) -> Tensor:
        """Log-mel features [frames, mel_dim] -> x-vector [enc_dim] (float32)."""
        x = self.first(mels.to(device=self.device, dtype=torch.float32).transpose(0, 1)[None])
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.aggregate(torch.cat(outputs, dim=1))
        return self.fc(self.pool(x).unsqueeze(2))[0, :, 0]

    def embed(self, wav: Tensor | np.ndarray) -> Tensor:
        """A mono clip at 24 kHz (float32, at least 385 samples) -> its x-vector [enc_dim] (float32)."""
        samples = torch.as_tensor(np.asarray(wav, dtype=np.float32) if isinstance(wav, np.ndarray) else wav)
        return self.embed_features(log_mel_spectrogram(samples.float().to(self.device)))
