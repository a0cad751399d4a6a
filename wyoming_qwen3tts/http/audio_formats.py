"""The speech API's response formats: 24 kHz mono PCM chunks in, encoded bytes out as soon as the encoder has them.

`pcm` is the engine's own s16le passed through.  The others are encoded and muxed by PyAV (FFmpeg's
encoders and muxers, shipped inside PyAV's wheels: no system FFmpeg needed): wav (PCM in RIFF),
mp3 (LAME), opus (libopus in Ogg), aac (FFmpeg's AAC in ADTS) and flac.  The muxer writes into a
sink that cannot seek, so nothing already sent is ever rewritten: WAV sizes are 0xFFFFFFFF and FLAC
STREAMINFO counts 0 samples ("unknown", as the formats allow and as OpenAI streams WAV), and Ogg
pages are cut every 80 ms so Opus bytes leave after each frame group.

`speed` other than 1 runs FFmpeg's atempo filter (a WSOLA time stretch: tempo changes, pitch does
not); atempo takes 0.5..100 per stage, so 0.25 is two 0.5 stages.  It holds back the first frame
group or two (at 0.25) before its first output: the stretch needs audio ahead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np

from ..request import CHANNELS, SAMPLE_RATE

MIN_SPEED = 0.25
MAX_SPEED = 4.0
_ATEMPO_MIN = 0.5
_TIME_BASE = Fraction(1, SAMPLE_RATE)


@dataclass(frozen=True)
class AudioFormat:
    name: str
    content_type: str
    container: str | None = None  # None: raw PCM, no encoder
    codec: str | None = None
    options: dict[str, str] = field(default_factory=dict)  # muxer options
    heavy: bool = False  # encoding costs milliseconds per second of audio: done off the event loop


# bitexact: no "Lavf..." encoder tag in the headers, the same bytes for the same audio.
_ALL_FORMATS = [
    AudioFormat("mp3", "audio/mpeg", "mp3", "libmp3lame", {"fflags": "+bitexact"}, heavy=True),
    AudioFormat("opus", "audio/ogg", "ogg", "libopus", {"fflags": "+bitexact", "page_duration": "80000"}, heavy=True),
    AudioFormat("aac", "audio/aac", "adts", "aac", {"fflags": "+bitexact"}, heavy=True),
    AudioFormat("flac", "audio/flac", "flac", "flac", {"fflags": "+bitexact"}, heavy=True),
    AudioFormat("wav", "audio/wav", "wav", "pcm_s16le", {"fflags": "+bitexact"}),
    AudioFormat("pcm", "audio/pcm"),
]


def _encoder_available(fmt: AudioFormat) -> bool:
    if fmt.codec is None:
        return True
    return fmt.codec in av.codecs_available and fmt.container in av.formats_available


# The formats this PyAV build can write, in OpenAI's order.
FORMATS: dict[str, AudioFormat] = {f.name: f for f in _ALL_FORMATS if _encoder_available(f)}


class _Sink:
    """A write-only file for PyAV: without seek(), muxers write their headers once, up front."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class AudioEncoder:
    """One response's encoder: encode() each PCM chunk, then finish() once (or close() to abandon it)."""

    def __init__(self, fmt: AudioFormat, speed: float = 1.0) -> None:
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed {speed} is outside {MIN_SPEED}..{MAX_SPEED}")
        self.format = fmt
        self._samples = 0  # samples handed to the encoder, for frame timestamps
        self._pushed = 0  # samples handed to the tempo filter
        self._tempo = _tempo_graph(speed) if speed != 1.0 else None
        self._sink = _Sink()
        self._container: av.container.OutputContainer | None = None
        if fmt.container is not None:
            assert fmt.codec is not None, f"format {fmt.name!r} has a container and no codec"
            self._container = av.open(self._sink, mode="w", format=fmt.container, options=dict(fmt.options))
            stream = self._container.add_stream(fmt.codec, rate=SAMPLE_RATE, layout="mono")
            assert isinstance(stream, av.AudioStream)  # every codec in _ALL_FORMATS is an audio codec
            self._stream = stream

    def encode(self, pcm: bytes) -> bytes:
        """Bytes of the response for one more chunk of s16le PCM (may be empty while the encoder fills up)."""
        frame = _frame(np.frombuffer(pcm, dtype="<i2"))
        if self._tempo is None:
            return self._encode(frame)
        frame.pts = self._pushed
        frame.time_base = _TIME_BASE
        self._pushed += frame.samples
        self._tempo.push(frame)
        return b"".join(self._encode(f) for f in _pull_all(self._tempo))

    def finish(self) -> bytes:
        """The rest of the response: what the tempo filter and the encoder held back, and the trailer."""
        out = b""
        if self._tempo is not None:
            self._tempo.push(None)
            out += b"".join(self._encode(f) for f in _pull_all(self._tempo))
        if self._container is not None:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
            self._container = None
        return out + self._sink.take()

    def close(self) -> None:
        """Release the encoder of a response that ends early."""
        if self._container is not None:
            self._container.close()
            self._container = None

    def _encode(self, frame: av.AudioFrame) -> bytes:
        if self._container is None:
            return frame.to_ndarray().astype("<i2", copy=False).tobytes()
        frame.pts = self._samples
        frame.time_base = _TIME_BASE
        self._samples += frame.samples
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.take()


def _frame(samples: np.ndarray) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(samples.reshape(CHANNELS, -1), format="s16", layout="mono")
    frame.sample_rate = SAMPLE_RATE
    return frame


def _tempo_graph(speed: float) -> av.filter.Graph:
    graph = av.filter.Graph()
    nodes = [graph.add_abuffer(format="s16", sample_rate=SAMPLE_RATE, layout="mono", time_base=_TIME_BASE)]
    rest = speed
    while rest < _ATEMPO_MIN:
        nodes.append(graph.add("atempo", str(_ATEMPO_MIN)))
        rest /= _ATEMPO_MIN
    nodes.append(graph.add("atempo", repr(rest)))
    nodes.append(graph.add("abuffersink"))
    for upstream, downstream in zip(nodes, nodes[1:]):
        upstream.link_to(downstream)
    graph.configure()
    return graph


def _pull_all(graph: av.filter.Graph) -> list[av.AudioFrame]:
    frames: list[av.AudioFrame] = []
    while True:
        try:
            frame = graph.pull()
        except (BlockingIOError, EOFError):  # needs more input / flushed
            return frames
        assert isinstance(frame, av.AudioFrame)  # the graph ends in abuffersink: audio only
        frames.append(frame)
