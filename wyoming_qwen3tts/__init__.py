"""Wyoming (and OpenAI-style HTTP) text-to-speech server for Qwen3-TTS.

Layers, lowest first. A module imports only from its own layer or a lower one, and run-time
imports form no cycle (tests/repo/test_layers.py checks both):

1. leaves: wyoming_qwen3tts, errors, request, process, decode_counters
2. domain: text, model, voices
3. decode: backends, runaway
4. options: options, announcements, settings
5. engine: engine, engine_set, codec_worker
6. service: service
7. pipeline: metrics, speech, wire
8. protocols: handler, http
9. entry: __main__, say, voices.__main__, tools, bench

(`wyoming_qwen3tts` in layer 1 is this file, the version.)
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("wyoming-qwen3tts")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+src"
