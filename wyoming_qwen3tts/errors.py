"""Errors a synthesis request can end with; each carries a message meant for the user.

Each class also says how the front ends treat it, so Wyoming and HTTP classify an error alike:
`code` (the Wyoming error event's code and the HTTP body's), `http_status`, and `log_level`
(bad input and limits are warnings, clients leaving and shutdown info, the server's failures errors).
"""

import logging


class Qwen3TTSError(Exception):
    """Base class: every error the engine raises on purpose."""

    code = "synthesis-failed"
    http_status = 500
    log_level = logging.ERROR

    @property
    def client_fault(self) -> bool:
        """Whether the client's input or its share of the limits caused it (not the server)."""
        return 400 <= self.http_status < 500


class ModelLoadError(Qwen3TTSError):
    """The model could not be found, downloaded or loaded."""

    code = "model-load-failed"
    http_status = 503


class UnknownSpeakerError(Qwen3TTSError):
    code = "unknown-voice"
    http_status = 400
    log_level = logging.WARNING


class UnknownLanguageError(Qwen3TTSError):
    code = "unknown-language"
    http_status = 400
    log_level = logging.WARNING


class EmptyTextError(Qwen3TTSError):
    code = "empty-text"
    http_status = 400
    log_level = logging.WARNING


class TextTooLongError(Qwen3TTSError):
    code = "text-too-long"
    http_status = 400
    log_level = logging.WARNING


class SynthesisCancelled(Qwen3TTSError):
    """The request was cancelled (client gone, server stopping) before it finished."""

    code = "cancelled"


class ProtocolError(Qwen3TTSError):
    """An event that is malformed or not allowed at this point of the exchange."""

    code = "bad-request"
    http_status = 400
    log_level = logging.WARNING


class EventTooLargeError(ProtocolError):
    """An event (header line, data or payload) over max_event_bytes; refused before it is read."""

    code = "event-too-large"
    http_status = 413
    log_level = logging.WARNING


class IdleTimeoutError(Qwen3TTSError):
    """The client sent nothing for idle_timeout seconds."""

    code = "idle-timeout"
    http_status = 408
    log_level = logging.INFO


class GpuOutOfMemoryError(Qwen3TTSError):
    """The accelerator ran out of memory during a synthesis (the cached memory has been freed)."""

    code = "out-of-memory"
    http_status = 503  # the cached memory was freed: the next request may well succeed


class ServerBusyError(Qwen3TTSError):
    """More connections than max_connections."""

    code = "server-busy"
    http_status = 429
    log_level = logging.WARNING


class QueueFullError(Qwen3TTSError):
    """A new request while every decode slot is busy and max_queued_streams requests already wait for one."""

    code = "queue-full"
    http_status = 429
    log_level = logging.WARNING


class ShuttingDownError(Qwen3TTSError):
    """The server got SIGTERM: it finishes requests in progress but takes no new ones."""

    code = "shutting-down"
    http_status = 503
    log_level = logging.INFO


class TooManyRequestsError(Qwen3TTSError):
    """More requests pipelined on one connection than max_pending_requests."""

    code = "too-many-requests"
    http_status = 429
    log_level = logging.WARNING


class VoiceError(Qwen3TTSError):
    """A voice that this model cannot speak (a clone prompt for a CustomVoice model, a preset for a Base model), or a
    cloned voice that cannot be built (no transcript for in-context cloning)."""

    code = "bad-voice"


class ReferenceAudioError(VoiceError):
    """A reference clip for voice cloning that is not audio, too short, too long or silent."""

    code = "bad-reference-audio"
