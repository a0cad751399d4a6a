"""Wyoming text-to-speech server for Qwen3-TTS CustomVoice."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("wyoming-qwen3tts")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+src"
