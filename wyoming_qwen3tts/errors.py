"""Errors a synthesis request can end with; each carries a message meant for the user."""


class Qwen3TTSError(Exception):
    """Base class: every error the engine raises on purpose."""

    code = "synthesis-failed"


class ModelLoadError(Qwen3TTSError):
    """The model could not be found, downloaded or loaded."""

    code = "model-load-failed"


class UnknownSpeakerError(Qwen3TTSError):
    code = "unknown-voice"


class UnknownLanguageError(Qwen3TTSError):
    code = "unknown-language"


class EmptyTextError(Qwen3TTSError):
    code = "empty-text"


class TextTooLongError(Qwen3TTSError):
    code = "text-too-long"


class SynthesisCancelled(Qwen3TTSError):
    """The request was cancelled (client gone, server stopping) before it finished."""

    code = "cancelled"
