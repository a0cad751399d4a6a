"""The text front end: an LLM's streamed reply -> sentences -> the words the voice says."""

from .language import detect_language
from .normalize import speakable

__all__ = ["detect_language", "speakable"]
