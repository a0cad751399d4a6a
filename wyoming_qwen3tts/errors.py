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


class ProtocolError(Qwen3TTSError):
    """An event that is malformed or not allowed at this point of the exchange."""

    code = "bad-request"


class EventTooLargeError(ProtocolError):
    """An event (header line, data or payload) over max_event_bytes; refused before it is read."""

    code = "event-too-large"


class IdleTimeoutError(Qwen3TTSError):
    """The client sent nothing for idle_timeout seconds."""

    code = "idle-timeout"


class GpuOutOfMemoryError(Qwen3TTSError):
    """The accelerator ran out of memory during a synthesis (the cached memory has been freed)."""

    code = "out-of-memory"


class ServerBusyError(Qwen3TTSError):
    """More connections than max_connections."""

    code = "server-busy"


class QueueFullError(Qwen3TTSError):
    """A new request while every decode slot is busy and max_queued_streams requests already wait for one."""

    code = "queue-full"


class ShuttingDownError(Qwen3TTSError):
    """The server got SIGTERM: it finishes requests in progress but takes no new ones."""

    code = "shutting-down"


class TooManyRequestsError(Qwen3TTSError):
    """More requests pipelined on one connection than max_pending_requests."""

    code = "too-many-requests"


class VoiceError(Qwen3TTSError):
    """A voice that this model cannot speak (a clone prompt for a CustomVoice model, a preset for a Base model), or a
    cloned voice that cannot be built (no transcript for in-context cloning)."""

    code = "bad-voice"


class ReferenceAudioError(VoiceError):
    """A reference clip for voice cloning that is not audio, too short, too long or silent."""

    code = "bad-reference-audio"
