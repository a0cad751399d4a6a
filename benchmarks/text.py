"""`python -m benchmarks.text`: what the text front end and the runaway guards cost.

Times, on this CPU, per sentence: speakable() alone (cold, i.e. with num2words' cache cleared,
and warm), the whole streaming path (SpokenSentences fed 5-character fragments, per sentence
out), frame_budget(); and LoopDetector per frame.  The front end must stay under 1 ms a sentence.
"slowest_sentence_best_us" is the slowest sentence's best round: unlike p99 it does not count the
time the process was not running (a busy shared machine preempts it for milliseconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from wyoming_qwen3tts.runaway import LoopDetector, frame_budget
from wyoming_qwen3tts.text import words
from wyoming_qwen3tts.text.normalize import speakable
from wyoming_qwen3tts.text.stream import SpokenSentences

SENTENCES: dict[str, list[str]] = {
    "english": [
        "**Sure!** The living room is at 21.5°C and the humidity is 45%.",
        "Your flight leaves on 2024-06-15 at 7:45 AM from gate B12 🛫.",
        "The new thermostat costs $1,249.99, about 12% less than last year.",
        "Check [the docs](https://www.home-assistant.io/docs/automation/) or email support@nabucasa.com.",
        "I turned off the kitchen lights and locked the front door for you.",
    ],
    "german": [
        "**Gerne!** Im Wohnzimmer sind es 21,5 °C bei 45 % Luftfeuchtigkeit.",
        "Der neue Thermostat kostet 1.249,99 €, also etwa 12 % weniger.",
        "Der 3. Platz geht an Nr. 7, z. B. am 1. Mai.",
        "Ich habe das Licht in der Küche ausgeschaltet und die Haustür abgeschlossen.",
    ],
    "french": ["Le thermostat coûte 1 249,99 €, soit 12 % de moins.", "Le 1er mai, M. Dupont court 10 km."],
    "spanish": ["El termostato cuesta 1.249,99 €, un 12 % menos.", "Tu vuelo sale el 15/06/2024 a las 7:45 🛫."],
    "chinese": ["**好的！**客厅现在是21.5°C，湿度45%。", "北京有21,893,095人，面积16,410.54km²。"],
    "japanese": [
        "フライトは2024年6月15日の7:45に出発します🛫。",
        "新しいサーモスタットは¥12,800で、12%安くなりました。",
    ],
    "russian": ["Термостат стоит 1 249,99 ₽, то есть на 12 % дешевле."],
}


def _clear_caches() -> None:
    for fn in (words.cardinal, words.decimal, words.ordinal, words.year):
        fn.cache_clear()


def _summary(samples_us: list[float]) -> dict[str, float]:
    ordered = sorted(samples_us)
    return {
        "median_us": round(statistics.median(ordered), 1),
        "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        "max_us": round(ordered[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.text", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    pairs = [(language, s) for language, texts in SENTENCES.items() for s in texts]
    for language, text in pairs:  # imports and compiled patterns, once
        speakable(text, language)

    cold: list[float] = []
    warm: list[float] = []
    best_cold = [float("inf")] * len(pairs)
    for _ in range(args.rounds):
        for index, (language, text) in enumerate(pairs):
            _clear_caches()
            t0 = time.perf_counter()
            speakable(text, language)
            cold.append((time.perf_counter() - t0) * 1e6)
            best_cold[index] = min(best_cold[index], cold[-1])
            t0 = time.perf_counter()
            speakable(text, language)
            warm.append((time.perf_counter() - t0) * 1e6)

    streamed: list[float] = []
    for _ in range(max(1, args.rounds // 10)):
        for language, texts in SENTENCES.items():
            reply = "\n".join(f"- {t}" if i % 2 else t for i, t in enumerate(texts))
            stream = SpokenSentences(language)
            t0 = time.perf_counter()
            count = 0
            for i in range(0, len(reply), 5):
                count += len(stream.feed(reply[i : i + 5]))
            count += len(stream.finish())
            streamed.append((time.perf_counter() - t0) * 1e6 / max(count, 1))

    budget: list[float] = []
    for language, text in pairs:
        t0 = time.perf_counter()
        for _ in range(100):
            frame_budget(text, language)
        budget.append((time.perf_counter() - t0) * 1e4)

    codes = np.random.default_rng(0).integers(0, 2048, size=(12 * 100, 16))
    pcm = np.random.default_rng(1).integers(-3000, 3000, size=12 * 100 * 1920).astype(np.int16)
    detector = LoopDetector()
    t0 = time.perf_counter()
    for g in range(100):
        detector.feed(codes[g * 12 : (g + 1) * 12], pcm[g * 12 * 1920 : (g + 1) * 12 * 1920])
    per_frame = (time.perf_counter() - t0) * 1e6 / (12 * 100)

    print(
        json.dumps(
            {
                "sentences": len(pairs),
                "speakable_cold": _summary(cold) | {"slowest_sentence_best_us": round(max(best_cold), 1)},
                "speakable_warm": _summary(warm),
                "stream_per_sentence": _summary(streamed),
                "frame_budget": _summary(budget),
                "loop_detector_per_frame_us": round(per_frame, 1),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
