"""No runaway generation: the per-sentence frame budget and the stuck-loop detector."""

from __future__ import annotations

import math

import numpy as np
import pytest
from looping_backend import LoopingBackend

from wyoming_qwen3tts.engine import Engine, EngineOptions, SamplingParams, SynthesisRequest, next_group_size
from wyoming_qwen3tts.metrics import METRICS
from wyoming_qwen3tts.runaway import FRAMES_PER_SECOND, LoopDetector, LoopSettings, frame_budget, speech_seconds
from wyoming_qwen3tts.text.stream import spoken_sentences

TYPICAL = {
    "english": "The kitchen lights are off and the front door is locked for the night.",
    "german": "Die Küchenlichter sind aus und die Haustür ist für die Nacht abgeschlossen.",
    "french": "Les lumières de la cuisine sont éteintes et la porte d'entrée est fermée.",
    "spanish": "Las luces de la cocina están apagadas y la puerta principal está cerrada.",
    "italian": "Le luci della cucina sono spente e la porta d'ingresso è chiusa a chiave.",
    "portuguese": "As luzes da cozinha estão apagadas e a porta da frente está trancada.",
    "russian": "Свет на кухне выключен, а входная дверь заперта на ночь.",
    "chinese": "厨房的灯已经关了，前门也已经锁好了。",
    "japanese": "キッチンの電気は消えていて、玄関のドアも鍵がかかっています。",
    "korean": "부엌 불은 꺼져 있고 현관문은 잠겨 있습니다.",
}


# -- frame budget ---------------------------------------------------------------------------


def test_three_words_get_seconds_not_minutes():
    budget = frame_budget("Turn it off.", "english")
    assert 3.0 * FRAMES_PER_SECOND <= budget <= 8.0 * FRAMES_PER_SECOND  # the floor, plus a few seconds
    assert budget < 2048 / 10


@pytest.mark.parametrize("language", sorted(TYPICAL))
def test_typical_sentence_budget(language):
    """One typical sentence (3-5 s when spoken) gets 10-25 s: roomy, yet far below max_frames."""
    text = TYPICAL[language]
    seconds = speech_seconds(text, language)
    assert 2.5 <= seconds <= 6.5, seconds
    budget = frame_budget(text, language)
    assert budget >= math.ceil(FRAMES_PER_SECOND * 3 * seconds)
    assert 10 * FRAMES_PER_SECOND <= budget <= 25 * FRAMES_PER_SECOND


def test_budget_grows_with_length_and_stops_at_max_frames():
    budgets = [frame_budget("word " * n, "english") for n in (1, 5, 20, 80)]
    assert budgets == sorted(budgets) and len(set(budgets)) == 4
    assert frame_budget("长" * 400, "chinese") == 2048
    assert frame_budget("长" * 400, "chinese", max_frames=500) == 500
    assert frame_budget("", "english") == math.ceil(3.0 * FRAMES_PER_SECOND)  # the floor alone


def test_tokens_cover_scripts_without_a_rate():
    thai = "สวัสดีครับ วันนี้อากาศดีมาก"
    assert frame_budget(thai, "auto", tokens=40) >= math.ceil(FRAMES_PER_SECOND * (3 + 3 * 40 * 0.15))
    assert frame_budget(thai, "auto", tokens=40) > frame_budget(thai, "auto")


def test_digits_count_when_the_front_end_is_off():
    assert speech_seconds("It costs 1249 dollars.", "english") > speech_seconds("It costs dollars.", "english") + 1.0


def test_budget_of_the_spoken_text_covers_the_written_one():
    """Written out by the front end, a sentence with numbers only grows: its budget too."""
    for sentence in spoken_sentences("Am 15.06.2024 um 7:45 Uhr kostet es 1.249,99 €.", "german"):
        assert frame_budget(sentence.spoken, "german") >= frame_budget(sentence.text, "german")


# -- loop detector --------------------------------------------------------------------------


def _feed_in_groups(detector: LoopDetector, codes: np.ndarray, pcm: np.ndarray | None = None) -> tuple[int, str | None]:
    """Feed like Engine.synthesize: a group of 2, then doubling to 12. Returns (frames fed, reason)."""
    start, group = 0, 2
    while start < len(codes):
        chunk = codes[start : start + group]
        samples = None if pcm is None else pcm[start * 1920 : (start + len(chunk)) * 1920]
        reason = detector.feed(chunk, samples)
        start += len(chunk)
        if reason is not None:
            return start, reason
        group = next_group_size(group, 12)
    return start, None


def test_varied_codes_are_never_stopped():
    rng = np.random.default_rng(0)
    uniform = rng.integers(0, 2048, size=(5000, 16))
    # concentrated on 40 codes (much less varied than speech), still without exact periods
    skewed = uniform.copy()
    skewed[:, 0] = rng.choice(40, size=5000, p=np.arange(40, 0, -1) / np.arange(40, 0, -1).sum())
    for codes in (uniform, skewed):
        assert _feed_in_groups(LoopDetector(), codes) == (5000, None)


def test_a_short_pause_is_not_a_loop():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 2048, size=(200, 16))
    codes[50:75, 0] = 7  # 2 s of the same silence code: shorter than min_loop_seconds
    assert _feed_in_groups(LoopDetector(), codes) == (200, None)


@pytest.mark.parametrize("period", range(1, 9))
def test_stuck_patterns_are_stopped(period):
    rng = np.random.default_rng(period)
    pattern = rng.integers(0, 2048, size=(period, 16))
    codes = np.concatenate([rng.integers(0, 2048, size=(60, 16)), np.tile(pattern, (400 // period, 1))])
    frames, reason = _feed_in_groups(LoopDetector(), codes)
    window = max(4 * period, math.ceil(2.5 * FRAMES_PER_SECOND))
    assert reason is not None and (f"{period}-frame pattern" in reason or (period == 1 and "one code" in reason))
    assert 60 + window - period <= frames <= 60 + window + 12  # found within one group of the window filling
    # residual codes may vary: only code 0 is looked at
    codes[60:, 1:] = rng.integers(0, 2048, size=(len(codes) - 60, 15))
    assert _feed_in_groups(LoopDetector(), codes)[1] is not None


def test_stop_is_the_same_frame_by_frame_or_in_groups():
    codes = np.concatenate(
        [np.random.default_rng(2).integers(0, 2048, size=(37, 16)), np.tile([[5] * 16, [9] * 16], (40, 1))]
    )
    one_by_one = LoopDetector()
    stopped_at = next(i + 1 for i in range(len(codes)) if one_by_one.feed(codes[i : i + 1]) is not None)
    grouped = LoopDetector()
    grouped.feed(codes)
    assert grouped.frames == one_by_one.frames == stopped_at
    assert grouped.feed(codes[:3]) == grouped.reason  # once stopped it stays stopped


def _pcm(frames: int, dbfs: float, rng: np.random.Generator) -> np.ndarray:
    amplitude = 32768 * 10 ** (dbfs / 20) * math.sqrt(2)
    t = np.arange(frames * 1920)
    return (amplitude * np.sin(2 * np.pi * 220 * t / 24000) + rng.normal(0, 1, t.size)).astype(np.int16)


def test_long_silence_is_stopped_short_silence_is_not():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 2048, size=(150, 16))
    speech = _pcm(150, -25, rng)
    quiet_2s = speech.copy()
    quiet_2s[40 * 1920 : 65 * 1920] = rng.normal(0, 20, 25 * 1920).astype(np.int16)  # ~ -64 dBFS for 2 s
    assert _feed_in_groups(LoopDetector(), codes, quiet_2s) == (150, None)
    quiet_4s = speech.copy()
    quiet_4s[40 * 1920 : 90 * 1920] = 0
    frames, reason = _feed_in_groups(LoopDetector(), codes, quiet_4s)
    assert reason is not None and "near silence" in reason
    assert 40 + 38 <= frames <= 40 + 38 + 12
    # quiet speech (-40 dBFS) is not silence; silence_seconds=0 turns the check off
    assert _feed_in_groups(LoopDetector(), codes, _pcm(150, -40, rng)) == (150, None)
    assert _feed_in_groups(LoopDetector(LoopSettings(silence_seconds=0)), codes, quiet_4s) == (150, None)


def test_pcm_must_match_the_frames():
    with pytest.raises(ValueError):
        LoopDetector().feed(np.zeros((2, 16), dtype=np.int64), b"\x00" * 1920 * 2)


def test_looping_backend_session_stops_early():
    """The engine's loop shape on a backend stuck after 30 frames: stopped within ~3 s, not 2,048 frames."""
    session = LoopingBackend(30, [[3] * 16, [4] * 16, [3] * 16]).start(None, SamplingParams(), 0, 2048)
    detector = LoopDetector()
    group, decoded = 2, 0
    session.launch(group)
    while True:
        codes = session.collect()
        if len(codes) == 0:
            break
        decoded += len(codes)
        group = next_group_size(group, 12)
        if not session.finished:
            session.launch(group)
        if detector.feed(codes) is not None:
            break
    assert 30 + 32 - 3 <= decoded <= 30 + 32 + 12
    assert "3-frame pattern" in detector.reason


@pytest.mark.slow
def test_random_weights_stop_at_the_budget_and_their_codes_are_not_a_loop(tiny_checkpoint_06b):
    """Random weights never end a sentence: the budget ends it after seconds.  Their sampled codes
    and audio (varied, like speech) pass the loop detector untouched for 100+ frames."""
    engine = Engine.from_pretrained(
        str(tiny_checkpoint_06b), EngineOptions(device="cpu", dtype="float32", chunk_frames=12)
    )
    text = "Please turn off the lights."
    budget = frame_budget(text, "english")
    assert 100 <= budget <= 150
    detector = LoopDetector()
    frames = 0
    request = SynthesisRequest(text=text, speaker="ryan", seed=0, max_frames=budget)
    for chunk in engine.synthesize(request):
        frames += chunk.num_frames
        assert detector.feed(chunk.codes, chunk.pcm) is None, detector.reason
    assert frames == budget  # no end of speech: the budget stopped it
    assert frames / FRAMES_PER_SECOND < 12.5

    # The engine applies that budget itself to a request that sets no max_frames (the server's),
    # warns and marks the last chunk (the front ends count it); with stop_runaway off the same
    # request runs to max_frames.
    chunks = list(engine.synthesize(SynthesisRequest(text=text, speaker="ryan", seed=0)))
    assert sum(chunk.num_frames for chunk in chunks) == budget
    assert [c.stopped for c in chunks] == [None] * (len(chunks) - 1) + ["budget"]
    unguarded = Engine.from_pretrained(
        str(tiny_checkpoint_06b),
        EngineOptions(device="cpu", dtype="float32", max_frames=budget + 20, stop_runaway=False),
    )
    assert (
        sum(c.num_frames for c in unguarded.synthesize(SynthesisRequest(text=text, speaker="ryan", seed=0)))
        == budget + 20
    )


def test_engine_stops_a_stuck_loop_and_keeps_its_audio(tiny_checkpoint_06b, caplog):
    """On a backend stuck after 30 frames (a 3-frame code-0 pattern) the engine ends the sentence
    within one frame group of the detector's window, keeps the audio decoded so far, logs why and
    counts the stop; without the guard the same session runs to max_frames."""
    engine = Engine.from_pretrained(
        str(tiny_checkpoint_06b), EngineOptions(device="cpu", dtype="float32", max_frames=400)
    )
    engine.backend = LoopingBackend(30, [[3] * 16, [4] * 16, [3] * 16])
    request = SynthesisRequest(
        text="Please turn off the lights, all of them, in every room of the house.", speaker="ryan"
    )
    with caplog.at_level("WARNING", logger="wyoming_qwen3tts.engine"):
        chunks = list(engine.synthesize(request))
    frames = sum(c.num_frames for c in chunks)
    assert 30 + 32 - 3 <= frames <= 30 + 32 + 12
    assert all(len(c.pcm) == c.num_frames * 1920 * 2 for c in chunks)
    assert [c.stopped for c in chunks] == [None] * (len(chunks) - 1) + ["loop"]
    assert any("3-frame pattern" in r.getMessage() and "Sentence stopped" in r.getMessage() for r in caplog.records)
    engine.stop_runaway = False
    assert sum(c.num_frames for c in engine.synthesize(request)) == 400


async def test_a_runaway_stop_is_counted_by_the_front_end_that_spoke_it():
    """speech.speak counts a chunk's stop reason into qwen3tts_runaway_stops_total (the engine counts nothing)."""
    import threading

    from wyoming_qwen3tts import speech
    from wyoming_qwen3tts.request import AudioChunk
    from wyoming_qwen3tts.text.stream import Sentence
    from wyoming_qwen3tts.voices import VoiceChoice

    class Service:
        async def synthesize(self, request, cancel, *, continuing=False):
            codes = np.zeros((1, 16), dtype=np.int64)
            yield AudioChunk(pcm=bytes(3840), codes=codes)
            yield AudioChunk(pcm=bytes(3840), codes=codes, stopped="loop")

    before = METRICS.runaway_stops.labels("loop")._value.get()
    meter = METRICS.speech("wyoming", started_at=0.0)
    voice = VoiceChoice(voice="ryan", speaker="ryan", language="english", instruct=None)
    chunks = speech.speak(
        Service(), voice, speech.each([Sentence("Hi.", "Hi.", "english")]), threading.Event(), meter, seed=None
    )  # type: ignore[arg-type]
    assert [c.stopped async for c in chunks] == [None, "loop"]
    meter.finish("ok")
    assert METRICS.runaway_stops.labels("loop")._value.get() == before + 1
