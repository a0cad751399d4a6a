"""A fake engine with the Engine interface (engine_set.Speaker), for the tests of everything above the engine.

One frame per word of a sentence, each its own frame group; every sample of the i-th word's frame is i + 1, so
tests can check the order of the audio. It can wait `frame_delay` seconds a frame and fail on a marker text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np

from wyoming_qwen3tts.errors import Qwen3TTSError
from wyoming_qwen3tts.request import SAMPLES_PER_FRAME, AudioChunk, SynthesisRequest
from wyoming_qwen3tts.voices import SPEAKER_DESCRIPTIONS


class FakeEngine:
    """The Engine interface (engine_set.Speaker): frames per sentence = number of words, one frame group per word."""

    speakers = list(SPEAKER_DESCRIPTIONS)
    languages = [
        "auto",
        "chinese",
        "english",
        "german",
        "italian",
        "portuguese",
        "spanish",
        "japanese",
        "korean",
        "french",
        "russian",
    ]
    supports_instruct = True
    model_types = {"custom_voice"}
    max_streams = 1
    identity = "fake"  # the model it stands for, as the announcement cache tells models apart

    def announcement_identity(self) -> str:
        return self.identity

    def warm_up(self) -> float:
        return 0.0

    def warm_thread(self) -> None:
        pass

    def __init__(
        self, frame_delay: float = 0.0, fail_on: str | None = None, fail_with: type[Exception] = Qwen3TTSError
    ) -> None:
        self.frame_delay = frame_delay
        self.fail_on = fail_on
        self.fail_with = fail_with
        self.requests: list[SynthesisRequest] = []
        self.cancelled: list[str] = []
        self.frames_done = 0
        self.clone_prompts: dict[str, object] = {}  # a CustomVoice model clones nothing

    def synthesize(self, request: SynthesisRequest, cancel: threading.Event | None = None) -> Iterator[AudioChunk]:
        self.requests.append(request)
        words = request.text.split()
        done = 0
        try:
            for i, _word in enumerate(words):
                if cancel is not None and cancel.is_set():
                    return
                if self.fail_on is not None and self.fail_on in request.text:
                    raise self.fail_with("engine exploded")
                time.sleep(self.frame_delay)
                self.frames_done += 1
                # The sample value encodes the word index so order can be checked.
                pcm = np.full(SAMPLES_PER_FRAME, i + 1, dtype="<i2").tobytes()
                yield AudioChunk(pcm=pcm, codes=np.zeros((1, 16), dtype=np.int64))
                done += 1
        finally:
            # Stopped early by the cancel event or by the caller closing the generator.
            if done < len(words) and (cancel is None or cancel.is_set()):
                self.cancelled.append(request.text)
