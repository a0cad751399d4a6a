"""No runaway generation: a frame budget from a sentence's own length, and a stuck-loop detector.

A sampled model can miss its end of speech (random weights never emit it), and `max_frames`
(2,048 frames, 164 s) is far too long to babble for one sentence.  So each sentence may decode
at most `frame_budget()` frames, a generous multiple of how long its text takes to say; and
`LoopDetector` stops earlier when the codes show the model is stuck: code 0 (the semantic code,
which changes nearly every frame in speech) repeating one short pattern, or the audio staying near
silent for seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .request import SAMPLES_PER_FRAME
from .text.language import detect_language

FRAMES_PER_SECOND = 12.5  # the codec's frame rate: 24,000 samples/s / 1,920 samples per frame

# Seconds of speech per character, at an ordinary reading pace.  Alphabetic text by language, from
# words per minute x letters per word (spaces and punctuation included): English ~160 wpm x 5.5 =
# 14.5 chars/s; German and Russian have longer words at a slightly lower syllable rate (13/s);
# Spanish and Italian are syllable-timed and fast (15/s).  Syllabic scripts per character: a Han
# character is one Mandarin syllable (~4.5/s); Japanese runs at ~7.5 morae/s, a kana is one mora
# and a kanji about two; a Hangul block is one Korean syllable (~6/s).  A digit (front end off)
# is read as about one word.
_LETTERS_PER_SECOND = {
    "english": 14.5,
    "german": 13.0,
    "french": 14.0,
    "spanish": 15.0,
    "italian": 15.0,
    "portuguese": 14.0,
    "russian": 13.0,
}
_DEFAULT_LETTERS_PER_SECOND = 14.0
_HAN_SECONDS = {"japanese": 0.27, "chinese": 0.22}
_KANA_SECONDS = 0.135
_HANGUL_SECONDS = 0.17
_DIGIT_SECONDS = 0.3
_PAUSE_SECONDS = {
    ",": 0.2,
    ";": 0.25,
    ":": 0.25,
    ".": 0.35,
    "!": 0.35,
    "?": 0.35,
    "，": 0.2,
    "、": 0.15,
    "。": 0.35,
    "！": 0.35,
    "？": 0.35,
    "；": 0.25,
    "：": 0.25,
    "\n": 0.35,
}
# A text token takes at least this long to say: a lower bound for scripts the character classes
# above do not know (Thai, Arabic, ...).  English and Chinese tokens take ~0.3 s.
_MIN_SECONDS_PER_TOKEN = 0.15


def speech_seconds(text: str, language: str = "auto") -> float:
    """About how long `text` takes to say at an ordinary pace (a cheap count over its characters)."""
    if language not in _LETTERS_PER_SECOND and language not in _HAN_SECONDS and language != "korean":
        language = detect_language(text)
    letter = 1.0 / _LETTERS_PER_SECOND.get(language, _DEFAULT_LETTERS_PER_SECOND)
    han = _HAN_SECONDS.get(language, _HAN_SECONDS["chinese"])
    seconds = 0.0
    for ch in text:
        o = ord(ch)
        if o < 0x80:
            if ch.isalpha() or ch == " ":
                seconds += letter
            elif ch.isdigit():
                seconds += _DIGIT_SECONDS
            else:
                seconds += _PAUSE_SECONDS.get(ch, 0.0)
        elif 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF:
            seconds += han
        elif 0x3040 <= o <= 0x30FF:
            seconds += _KANA_SECONDS
        elif 0xAC00 <= o <= 0xD7A3:
            seconds += _HANGUL_SECONDS
        elif ch.isalpha():
            seconds += letter
        else:
            seconds += _PAUSE_SECONDS.get(ch, 0.0)
    return seconds


def frame_budget(
    text: str,
    language: str = "auto",
    tokens: int | None = None,
    *,
    max_frames: int = 2048,
    margin: float = 3.0,
    floor_seconds: float = 3.0,
) -> int:
    """The most frames one sentence may decode: `floor_seconds` plus `margin` times its expected
    length (from its characters, or from its `tokens` where that is longer), never above `max_frames`.

    The margin of 3 covers a slow speaking style (an instruction such as "speak slowly" halves the
    pace) with room to spare; the floor covers the silence around a short utterance ("OK.").
    """
    seconds = speech_seconds(text, language)
    if tokens is not None:
        seconds = max(seconds, tokens * _MIN_SECONDS_PER_TOKEN)
    frames = math.ceil(FRAMES_PER_SECOND * (floor_seconds + margin * seconds))
    return max(1, min(max_frames, frames))


@dataclass(frozen=True)
class LoopSettings:
    """When LoopDetector stops a sentence (the defaults are argued in its docstring)."""

    max_period: int = 8  # longest code-0 pattern looked for, in frames
    min_repeats: int = 4  # a pattern must repeat this often ...
    min_loop_seconds: float = 2.5  # ... and fill at least this long
    silence_seconds: float = 3.0  # this long below silence_dbfs stops too; 0 turns the check off
    silence_dbfs: float = -50.0  # frame RMS relative to full scale


class LoopDetector:
    """Fed each frame group's codes (and PCM), says when the decode is stuck, and why.

    (a) Code 0 periodic: the last W frames satisfy c0[t] == c0[t - P] for some period P <= 8,
        W = max(4 P, 2.5 s).  In speech code 0 changes nearly every frame; if a frame matched the
        frame P before it even as often as 1 in 5 (far more than speech does), W - P >= 24 matches
        in a row (0.2^24 = 2e-17 at one frame, for one period) would come by chance less than once
        in 10^12 sentences of 2,048 frames, counting all 8 periods.  An exact loop is what a stuck
        model does: a held tone or the same silence code, frame after frame.
    (b) Near silence: `silence_seconds` of frames whose RMS is below `silence_dbfs`.  Speech
        frames sit around -30..-15 dBFS and the pause between two sentences lasts well under a
        second; three seconds of silence inside one sentence is a model that forgot to stop.
    Linear in the frames: per frame, max_period comparisons and one RMS.
    """

    def __init__(self, settings: LoopSettings | None = None) -> None:
        self.settings = s = settings or LoopSettings()
        self.frames = 0
        self._history: list[int] = []  # the last max_period codes 0
        self._runs = [0] * (s.max_period + 1)  # runs[P]: frames in a row with c0[t] == c0[t - P]
        self._needed = [
            max(p * s.min_repeats, math.ceil(s.min_loop_seconds * FRAMES_PER_SECOND)) - p
            for p in range(s.max_period + 1)
        ]
        self._quiet_frames = 0
        self._quiet_needed = math.ceil(s.silence_seconds * FRAMES_PER_SECOND) if s.silence_seconds > 0 else 0
        self._quiet_rms = 32768.0 * 10.0 ** (s.silence_dbfs / 20.0)
        self._quiet_energy = self._quiet_rms**2 * SAMPLES_PER_FRAME
        self.reason: str | None = None

    def feed(self, codes: np.ndarray, pcm: bytes | np.ndarray | None = None) -> str | None:
        """Codes [k, 16] (or [k]) of the next k frames and, optionally, their PCM (s16le bytes or
        int16 samples, k * 1920).  Returns why to stop, once a loop is seen; None otherwise."""
        if self.reason is not None:
            return self.reason
        code0 = np.asarray(codes).reshape(len(codes), -1)[:, 0].tolist()
        quiet = self._quiet_flags(pcm, len(code0))
        for index, code in enumerate(code0):
            self.frames += 1
            self.reason = self._add(int(code)) or self._add_quiet(quiet[index] if quiet is not None else False)
            if self.reason is not None:
                return self.reason
        return None

    def _add(self, code: int) -> str | None:
        history = self._history
        s = self.settings
        found = None
        for period in range(1, s.max_period + 1):
            if len(history) >= period and history[-period] == code:
                self._runs[period] += 1
                if found is None and self._runs[period] >= self._needed[period]:
                    found = period
            else:
                self._runs[period] = 0
        history.append(code)
        if len(history) > s.max_period:
            del history[0]
        if found is None:
            return None
        frames = self._runs[found] + found
        what = "one code" if found == 1 else f"a {found}-frame pattern"
        return f"code 0 repeated {what} for {frames} frames ({frames / FRAMES_PER_SECOND:.1f} s)"

    def _quiet_flags(self, pcm: bytes | np.ndarray | None, frames: int) -> list[bool] | None:
        if pcm is None or not self._quiet_needed:
            return None
        samples = (
            np.frombuffer(pcm, dtype="<i2") if isinstance(pcm, (bytes, bytearray, memoryview)) else np.asarray(pcm)
        )
        if samples.size != frames * SAMPLES_PER_FRAME:
            raise ValueError(f"pcm has {samples.size} samples; {frames} frames need {frames * SAMPLES_PER_FRAME}")
        # Each frame's energy (sum of squares, exact in int64) against the threshold's: the mean's comparison
        # without its float temporaries, run per chunk on the request's thread.
        x = samples.reshape(frames, SAMPLES_PER_FRAME).astype(np.int64)
        return (np.einsum("ij,ij->i", x, x) < self._quiet_energy).tolist()

    def _add_quiet(self, quiet: bool) -> str | None:
        self._quiet_frames = self._quiet_frames + 1 if quiet else 0
        if self._quiet_needed and self._quiet_frames >= self._quiet_needed:
            s = self.settings
            return f"{self._quiet_frames / FRAMES_PER_SECOND:.1f} s of near silence (below {s.silence_dbfs:g} dBFS)"
        return None
