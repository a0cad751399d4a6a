"""Requests in, PCM chunks out: text -> prompt -> decode loop -> codec, one frame group at a time.

`Engine.from_pretrained` loads a checkpoint (local dir or HF repo id) once, as its EngineOptions
(options.py) say; `Engine.synthesize`
is a blocking generator meant to run off the event loop. It yields an AudioChunk as soon as
each frame group is decoded: a small first group for low latency, larger groups after. Work
is done under a lock one frame group at a time, so requests from several threads interleave
fairly at group boundaries instead of one request holding the GPU to the end. On the batching
backend (many streams in one decode step) no lock is taken per group: the codes come from the
scheduler thread and the audio from one codec thread that batches every request's groups
(codec_worker.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from contextlib import nullcontext as _nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
import torch

from .announcements import checkpoint_identity
from .backends import (
    DecodeBackend,
    DecodeSession,
    FusesCodec,
    GathersArrivals,
    GroupSink,
    HandsGroupsOver,
    make_backend,
)
from .errors import EmptyTextError, GpuOutOfMemoryError, Qwen3TTSError, SynthesisCancelled, TextTooLongError, VoiceError
from .model.checkpoint import Checkpoint, load_checkpoint, resolve_dtype
from .model.clone import VoiceCloner
from .model.codec import CodecDecoder, CodecStream, int16_samples, samples_to_pcm
from .model.prompt import (
    ClonePrompt,
    Prompt,
    PromptParts,
    PromptVoice,
    Voice,
    chat_instruct,
    chat_text,
    prompt_for,
    resolve_voice,
)
from .model.quant import quantize_model
from .model.reference_audio import read_reference_audio
from .model.talker import Qwen3TTSModel
from .model.tokenizer import TextTokenizer
from .options import EngineOptions
from .process import release_gpu_memory
from .request import (
    CHANNELS,
    SAMPLE_RATE,
    SAMPLE_WIDTH,
    SAMPLES_PER_FRAME,
    AudioChunk,
    SamplingParams,
    SynthesisRequest,
)
from .runaway import FRAMES_PER_SECOND, LoopDetector, frame_budget
from .text.sentences import clean_client_text

if TYPE_CHECKING:
    from .voices import VoiceKind, VoicePreset

_LOGGER = logging.getLogger(__name__)

__all__ = [
    "AudioChunk",
    "Engine",
    "EngineOptions",
    "SamplingParams",
    "SynthesisRequest",
    "SAMPLE_RATE",
    "SAMPLE_WIDTH",
    "CHANNELS",
    "SAMPLES_PER_FRAME",
    "pick_device",
    "pcm16",
]

# Talker positions a batched stream's cache holds beyond max_frames: its prompt (a long sentence is ~150).
PROMPT_POSITIONS = 1024


def pick_device(device: str) -> torch.device:
    if device in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise Qwen3TTSError("--device cuda was asked for, but torch sees no CUDA/ROCm GPU")
    return dev


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype in ("", "auto"):
        # bf16 on GPUs (the release's own dtype); float32 on CPU where bf16 matmuls are slow.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return resolve_dtype(dtype)


def pcm16(wave: torch.Tensor) -> bytes:
    """Float waveform in [-1, 1] -> s16le bytes."""
    return samples_to_pcm(int16_samples(wave))


class AudioSink(Protocol):
    """Where one request's frame groups become s16le PCM, in order (codec_worker.WorkerStream, or _InlineAudio)."""

    needs_engine_lock: bool  # decode() runs the codec on the caller's thread, which must hold Engine._lock

    def decode(self, codes: np.ndarray) -> bytes: ...

    def close(self) -> None: ...


class _InlineAudio:
    """The codec on the request's own thread, under the engine lock: the one-stream backends' audio."""

    needs_engine_lock = True

    def __init__(self, engine: Engine, stream: CodecStream) -> None:
        self._engine, self._stream = engine, stream

    def decode(self, codes: np.ndarray) -> bytes:
        engine = self._engine
        return samples_to_pcm(engine._decode_audio(self._stream, codes), engine._codec_stream)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Validated:
    """A request checked against the model: what the prompt is built from, resolved once."""

    text: str  # cleaned, stripped, within max_text_chars
    voice: PromptVoice  # speaker or clone, and the language id


@dataclass
class EngineInfo:
    model: str
    device: str
    dtype: str
    backend: str
    backend_reason: str
    weights: str = "bf16"  # EngineOptions.weights: int8 when the matrices were quantized at load


class Engine:
    """One loaded model. synthesize() is a blocking generator: run it off the event loop."""

    sample_rate = SAMPLE_RATE
    sample_width = SAMPLE_WIDTH
    channels = CHANNELS

    def __init__(
        self,
        checkpoint: Checkpoint,
        model: Qwen3TTSModel,
        codec: CodecDecoder,
        tokenizer: TextTokenizer,
        backend: DecodeBackend,
        options: EngineOptions = EngineOptions(),
        info: EngineInfo | None = None,
        cloner: VoiceCloner | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.model = model
        self.codec = codec
        self.tokenizer = tokenizer
        self.backend = backend
        self.first_chunk_frames = options.first_chunk_frames
        self.chunk_frames = options.chunk_frames
        self.max_frames = options.max_frames
        self.max_text_chars = options.max_text_chars
        self.stop_runaway = options.stop_runaway
        self._chat_tokens: int | None = None
        self.cloner = cloner  # Base models: builds ClonePrompts from reference clips
        self.clone_prompts: dict[str, ClonePrompt] = {}  # the server's cloned voices by name (clone_voices)
        # A cloned voice's codec context (its clip's codes), decoded once and forked per request.
        self._context_streams: dict[int, tuple[ClonePrompt, CodecStream]] = {}
        # Each voice's text-independent prompt vectors, made once: a request computes only its text's.
        self.prompt_parts = PromptParts()
        # One rule for every caller: the checkpoint's generation_config.json, then the options' overrides.
        self.default_sampling = options.sampling.apply(
            SamplingParams.from_generation_config(checkpoint.generation_config)
        )
        self.info = info or EngineInfo(str(checkpoint.path), str(model.device), str(model.dtype), backend.name, "")
        self._lock = threading.Lock()
        self._session_lock = threading.Lock()
        # What a request holds while it builds its prompt and starts its session. The batching backend starts
        # sessions from any thread and captures no graph while it serves, and a prompt is made of the weights
        # alone: no lock (under the engine's, each of a burst of 64 held it ~0.7 ms and waited 30 ms for it at the
        # median, measured on an H100). The one-stream backends keep the engine's lock.
        self._request_lock: AbstractContextManager[object] = (
            _nullcontext() if backend.thread_safe_sessions else self._lock
        )
        self._context_lock = threading.Lock()  # _context_streams
        # The codec runs beside the decode loop on its own stream. One stream at a time: the same
        # priority (measured on the H200, a high-priority codec stream stalls the latency-bound decode
        # loop, e2e +17 %). Many streams at once: high priority, since the batched steps keep the GPU
        # full and a same-priority codec waited behind them (run 25: a lone request at max_streams 16
        # took 6.7 s for 150 frames that the decoder steps in 0.8 s).
        concurrent = backend.concurrent_sessions
        self._codec_stream = (
            torch.cuda.Stream(model.device, priority=-1 if concurrent else 0) if model.device.type == "cuda" else None
        )
        # The batching backend's sessions may be collected from any thread: one codec thread batches the groups
        # of all its requests, so many streams cost about one stream's codec launches and none holds the lock.
        self._codec_worker = None
        # Where a request's frame groups become audio, chosen once: the codec worker, or inline on the
        # request's thread under the engine lock (the one-stream backends).
        self._open_audio: Callable[[CodecStream], AudioSink] = partial(_InlineAudio, self)
        if backend.thread_safe_sessions:
            from .codec_worker import CodecWorker

            # Twice the streams: a request's codec slot goes back when it ends, which may be after the next
            # request has opened its own; the slots growing would drop the captured calls (CodecSlots.open).
            self._codec_worker = CodecWorker(codec, self._codec_stream, 2 * backend.max_streams)
            self._open_audio = self._codec_worker.open

    # -- what the model offers ------------------------------------------------------------
    @property
    def speakers(self) -> list[str]:
        return self.config.speakers

    @property
    def languages(self) -> list[str]:
        return self.config.languages

    @property
    def supports_instruct(self) -> bool:
        return self.config.supports_instruct

    @property
    def max_streams(self) -> int:
        """Requests this engine decodes at once (its backend's streams; 1 where it runs one at a time)."""
        return self.backend.max_streams if self.backend.concurrent_sessions else 1

    @property
    def model_types(self) -> set[str]:
        """engine_set.Speaker: the one kind of voice this model speaks."""
        return {self.model_type}

    @property
    def model_type(self) -> VoiceKind:
        """custom_voice (preset speakers), base (cloned voices) or voice_design (described voices)."""
        # Qwen3TTSConfig.from_dict refuses any other tts_model_type.
        return cast("VoiceKind", self.config.tts_model_type)

    def announcement_identity(self) -> str:
        """engine_set.Speaker: what this model contributes to the announcement cache's keys. The checkpoint (path,
        config, its weight files' sizes and times), where and how it runs (device, dtype, backend, weights), its
        default sampling and its frame settings: everything of the engine that shapes a sentence's audio."""
        info = self.info
        return checkpoint_identity(
            type(self).__qualname__,
            Path(self.checkpoint.path),
            repr(self.config),
            repr(self.default_sampling),
            [info.device, info.dtype, info.backend, info.weights],
            [self.first_chunk_frames, self.chunk_frames, self.max_frames, self.stop_runaway, self.max_streams],
        )

    def clone_voices(self, presets: Sequence[VoicePreset]) -> dict[str, str]:
        """Clone each cloned-voice preset (VoicePreset with reference_audio) into clone_prompts; a voice
        that fails is logged with why and left out. Returns {name: why} of those."""
        failed: dict[str, str] = {}
        for preset in presets:
            assert preset.reference_audio is not None, f"voice {preset.name!r} is not a cloned voice"
            try:
                self.clone_prompts[preset.name] = self.clone_voice(
                    preset.reference_audio, preset.reference_text, x_vector_only=preset.x_vector_only
                )
            except Qwen3TTSError as err:
                failed[preset.name] = str(err)
                _LOGGER.error("Voice %r could not be cloned: %s", preset.name, err)
        if presets:
            _LOGGER.info("Cloned voices ready: %d of %d", len(presets) - len(failed), len(presets))
        return failed

    def clone_voice(
        self, reference_audio: str | Path, transcript: str | None = None, *, x_vector_only: bool = False
    ) -> ClonePrompt:
        """A Base model's prompt for the voice in a clip (cached on disk when the engine has a voices cache).
        Blocking (runs the encoders on a miss). Raises VoiceError (ReferenceAudioError for a bad clip)."""
        if self.cloner is None:
            raise VoiceError(f"cloning a voice needs a Base model; {self.config.model_type_name} is loaded")
        audio = read_reference_audio(reference_audio)
        with self._lock:
            return self.cloner.clone(audio, transcript, x_vector_only=x_vector_only)

    # -- loading --------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model: str, options: EngineOptions = EngineOptions()) -> Engine:
        """Resolve/download, load and prepare the model. Blocking; may take minutes on first start."""
        started = time.monotonic()
        dev = pick_device(options.device)
        torch_dtype = pick_dtype(options.dtype, dev)
        # Loaded to host memory first (zero-copy file mappings where the dtype matches); the model
        # moves what it needs to the device tensor by tensor, which keeps the GPU peak low.
        ckpt = load_checkpoint(
            model,
            options.data_dir,
            dtype=torch_dtype,
            device="cpu",
            local_files_only=options.local_files_only,
            model_types=("custom_voice", "base", "voice_design"),
        )
        tokenizer = TextTokenizer.from_dir(ckpt.path)
        # Base: the encoders that turn a reference clip into a clone prompt (float32, on the model's device).
        cloner = (
            VoiceCloner.from_checkpoint(ckpt, tokenizer, cache_dir=options.voice_cache_dir, device=dev)
            if ckpt.config.tts_model_type == "base"
            else None
        )
        talker = Qwen3TTSModel.from_tensors(ckpt.config, ckpt.tensors, dtype=torch_dtype, device=dev)
        codec = CodecDecoder.from_tensors(ckpt.codec_config, ckpt.codec_tensors, dtype=torch_dtype, device=dev)
        # The modules now hold the weights (cast/moved where needed): drop the loader's references
        # so that originals which were copied (e.g. the float32 codec) are freed.
        ckpt.tensors.clear()
        ckpt.codec_tensors.clear()
        ckpt.speaker_encoder_tensors.clear()
        ckpt.codec_encoder_tensors.clear()
        if options.weights == "int8":
            report = quantize_model(talker)
            if dev.type == "cuda":
                torch.cuda.empty_cache()  # hand the freed bf16 matrices back, so the saving shows outside torch too
            _LOGGER.info("int8 weights: %s", report)
        chosen, reason = make_backend(
            options.backend,
            talker,
            options.kernels,
            max_streams=options.max_streams,
            max_seq=options.max_frames + PROMPT_POSITIONS,
            batch_invariant=options.batch_invariant,
            prefix_cache_bytes=options.prefix_cache_mb * 2**20,
        )
        if isinstance(chosen, FusesCodec):  # before the codec worker captures its calls
            chosen.fuse_codec(codec)
        device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
        info = EngineInfo(
            model,
            f"{dev} ({device_name})",
            str(torch_dtype).removeprefix("torch."),
            chosen.name,
            reason,
            options.weights,
        )
        _LOGGER.info(
            "Model %s (%s) loaded in %.1fs: device=%s dtype=%s weights=%s backend=%s%s",
            model,
            ckpt.config.model_type_name,
            time.monotonic() - started,
            info.device,
            info.dtype,
            info.weights,
            info.backend,
            f" ({reason})" if reason else "",
        )
        return cls(ckpt, talker, codec, tokenizer, chosen, options, info, cloner)

    # -- synthesis ------------------------------------------------------------------------
    def _voice(self, request: SynthesisRequest) -> Voice:
        """What build_prompt speaks with: a preset speaker, a clone prompt, or nothing (a designed voice)."""
        if request.clone is not None:
            return request.clone
        return request.speaker if self.model_type == "custom_voice" else None

    def validate(self, request: SynthesisRequest) -> Validated:
        """Raise the error a request would end with before any work is done; returns the request resolved
        (clean text, voice and language) for the prompt."""
        voice = resolve_voice(self.config, self._voice(request), request.language)
        # Control characters and ChatML markers become spaces (also for callers other than the front ends).
        text = clean_client_text(request.text).strip()
        if not text:
            raise EmptyTextError("text is empty")
        if len(text) > self.max_text_chars:
            raise TextTooLongError(f"text has {len(text)} characters; the limit is {self.max_text_chars}")
        return Validated(text, voice)

    def prepare(self, request: SynthesisRequest) -> Prompt:
        return self._prepare(request)[0]

    def _prepare(self, request: SynthesisRequest, marks: list[float] | None = None) -> tuple[Prompt, str, int]:
        """(the prompt, the clean text, the text's own token count). `marks` gets the times the text was
        tokenized and the prompt built (the first-chunk debug line's breakdown)."""
        validated = self.validate(request)
        text = validated.text
        instruct = (request.instruct or "").strip()
        instruct_ids = self.tokenizer.encode(chat_instruct(instruct)) if instruct else None
        text_ids = self.tokenizer.encode(chat_text(text))
        if self._chat_tokens is None:  # the chat template's own tokens, which take no time to say
            self._chat_tokens = len(self.tokenizer.encode(chat_text("")))
        if marks is not None:
            marks.append(time.monotonic())
        with self._request_lock:
            prompt = prompt_for(
                self.model,
                text_ids,
                validated.voice,
                instruct_ids,
                non_streaming_text=(
                    request.clone is None if request.non_streaming_text is None else request.non_streaming_text
                ),
                parts_cache=self.prompt_parts,
            )
        if marks is not None:
            marks.append(time.monotonic())
        return prompt, text, max(len(text_ids) - self._chat_tokens, 0)

    def synthesize(self, request: SynthesisRequest, cancel: threading.Event | None = None) -> Iterator[AudioChunk]:
        """Yield PCM chunks as frame groups are decoded. Raises SynthesisCancelled if `cancel` is set, and
        GpuOutOfMemoryError (after freeing the allocator's cache, so the next request runs) when the GPU
        runs out of memory.

        A request that leaves max_frames unset (the server's) is guarded against runaway generation
        (runaway.py): it ends at a frame budget from its own length, or earlier when the codes show
        a stuck loop, with a warning; its audio so far is kept. A request that sets max_frames
        (bench, tests) gets exactly that limit.
        """
        oom: str | None = None
        try:
            yield from self._synthesize(request, cancel)
        except torch.cuda.OutOfMemoryError as err:
            # Leave the except block first: its traceback keeps the failed step's tensors alive.
            oom = str(err).strip().splitlines()[0] if str(err).strip() else "CUDA out of memory"
        if oom is not None:
            release_gpu_memory()
            _LOGGER.error(
                "GPU out of memory while speaking %d characters with %s; cached memory freed, "
                "the request ends with an error and the next one runs normally (%s)",
                len(request.text),
                request.speaker,
                oom,
            )
            raise GpuOutOfMemoryError(f"The GPU ran out of memory: {oom}")

    def _synthesize(self, request: SynthesisRequest, cancel: threading.Event | None) -> Iterator[AudioChunk]:
        marks = [time.monotonic()]  # entered, then _prepare's marks
        # The batching backend may hold an admission for this prompt while it is built, to prefill it with others.
        arrivals = self.backend if isinstance(self.backend, GathersArrivals) else None
        if arrivals is not None:
            arrivals.expect_arrival()
        try:
            prompt, text, tokens = self._prepare(request, marks)
            max_frames = min(request.max_frames or self.max_frames, self.max_frames)
            guarded = self.stop_runaway and request.max_frames is None
            budget = frame_budget(text, request.language, tokens, max_frames=max_frames) if guarded else max_frames
            detector = LoopDetector() if guarded else None
            seed = request.seed if request.seed is not None else int.from_bytes(np.random.bytes(4), "little")
            first = request.first_chunk_frames or self.first_chunk_frames
            later = request.chunk_frames or self.chunk_frames
            sampling = request.sampling or self.default_sampling
        except BaseException:
            if arrivals is not None:
                arrivals.forget_arrival()
            raise
        # Backends whose sessions share device buffers (the captured kernel graph) run one whole
        # request at a time; the torch backend interleaves requests at frame-group boundaries.
        exclusive = self._session_lock if self.backend.exclusive_sessions else None
        session: DecodeSession | None = None
        audio: AudioSink | None = None
        if exclusive is not None:
            exclusive.acquire()
        try:
            with self._request_lock:
                session = self.backend.start(prompt, sampling, seed, budget)
                with self._context_lock:
                    stream = self._codec_stream_for(request.clone, prompt)
            audio = self._open_audio(stream)
            if isinstance(session, HandsGroupsOver) and isinstance(audio, GroupSink):
                session.hand_groups_to(audio)  # the batching backend's groups go to the codec worker at read-back
            # The batching backend: sessions and the codec worker need no engine lock (each waits for
            # its own stream), so a request never holds it while the GPU works.
            locked = self._lock if audio.needs_engine_lock else _nullcontext()
            frames = 0
            # Every session takes launch(n)/collect(): kernel sessions enqueue the frames at once
            # and run ahead, so group k+1 is decoded on the GPU while the codec works on group k.
            group = first
            session.launch(group)
            while True:
                if cancel is not None and cancel.is_set():
                    raise SynthesisCancelled("cancelled")
                with locked:
                    codes = session.collect()
                    if len(codes) == 0:
                        break
                    group = next_group_size(group, later)
                    # Launch the next group's frames (a few graph launches) BEFORE the codec's many
                    # small kernels: the GPU then decodes frames while the host is still issuing
                    # codec work. Measured on the H200 (docs/performance.md): codec first left the
                    # GPU idle during those launches, e2e/decode 1.23 instead of 1.08.
                    # Launched even when the session says it is finished: a batching session is finished
                    # when its last frame is decoded, maybe long before it is collected, and a finished
                    # session's launch() asks for nothing (one-stream sessions too).
                    session.launch(group)
                    pcm = audio.decode(codes)
                if frames == 0 and _LOGGER.isEnabledFor(logging.DEBUG):
                    _log_first_chunk(session, marks, time.monotonic())
                frames += len(codes)
                stuck = detector.feed(codes, pcm) if detector is not None else None
                # The session asks for at most `budget` frames: reaching it is the end of the sentence.
                over_budget = guarded and frames >= budget and budget < max_frames
                yield AudioChunk(
                    pcm=pcm,
                    codes=codes,
                    stopped="loop" if stuck is not None else "budget" if over_budget else None,
                    made_at=time.monotonic(),
                )
                if stuck is not None:
                    _stopped(f"{stuck}, after {frames} frames", text)
                    break
            if guarded and frames >= budget and budget < max_frames:
                _stopped(
                    f"no end of speech within its budget of {budget} frames ({budget / FRAMES_PER_SECOND:.1f} s)", text
                )
        finally:  # also on close() of an abandoned generator
            if arrivals is not None and session is None:
                arrivals.forget_arrival()  # it failed before its start() (a no-op after it)
            if session is not None:
                session.close()  # the batching backend: free the stream's slot now
            if audio is not None:
                audio.close()
            if exclusive is not None:
                exclusive.release()

    def _codec_stream_for(self, clone: ClonePrompt | None, prompt: Prompt) -> CodecStream:
        """A codec stream for this request: fresh, or after a cloned voice's context (its clip's codes, so the
        new audio continues the clip's, as the reference decodes it), decoded once per voice and forked."""
        if prompt.codec_context is None or clone is None:
            return self.codec.new_stream()
        cached = self._context_streams.get(id(clone))
        if cached is None or cached[0] is not clone:
            with (
                torch.inference_mode(),
                torch.cuda.stream(self._codec_stream) if self._codec_stream else _nullcontext(),
            ):
                base = self.codec.new_stream(prompt.codec_context.to(self.model.device))
            cached = (clone, base)  # the prompt is held, so its id is not reused while cached
            self._context_streams[id(clone)] = cached
        return cached[1].fork()

    def _decode_audio(self, stream: CodecStream, codes: np.ndarray) -> torch.Tensor:
        """Decode a frame group to int16 samples on the codec stream, without waiting for it."""
        with torch.inference_mode(), torch.cuda.stream(self._codec_stream) if self._codec_stream else _nullcontext():
            return int16_samples(stream.decode(torch.from_numpy(codes).to(self.model.device)))

    def warm_up(self) -> float:
        """One short greedy synthesis so the first real request finds kernels built, graphs
        captured and allocator pools warm. Returns the seconds it took."""
        started = time.monotonic()
        if self._codec_worker is not None:
            # Every batch size and group length the codec worker's calls take, before any request meets one.
            ladder = [self.first_chunk_frames]
            while ladder[-1] < self.chunk_frames:
                ladder.append(next_group_size(ladder[-1], self.chunk_frames))
            shapes = self._codec_worker.warm_up(ladder)
            _LOGGER.info(
                "Codec warmed up at %d call shapes (group lengths %s) in %.0f ms",
                shapes,
                ",".join(map(str, ladder)),
                (time.monotonic() - started) * 1000,
            )
        # A Base model warms up with a zero speaker embedding: any x-vector prompt has the same shape.
        clone = ClonePrompt(torch.zeros(self.config.talker.hidden_size)) if self.model_type == "base" else None
        request = SynthesisRequest(
            text="Hello.",
            speaker=self.speakers[0] if self.speakers else "",
            sampling=SamplingParams.greedy(),
            seed=0,
            max_frames=4,
            clone=clone,
        )
        for _ in self.synthesize(request):
            pass
        streams = self.backend.max_streams if self._codec_worker is not None else 1
        if streams > 1:
            # Many streams: max_streams requests at once, each long enough for the first and larger groups, so
            # the batched admission, the decoder's largest bucket and the codec worker's calls at every batch
            # size meet their first allocations here (measured on the H200, run 27: the first round of 4
            # requests got first audio at 285 ms, the next at 141).
            many = replace(request, max_frames=2 * self.chunk_frames)
            with ThreadPoolExecutor(streams, thread_name_prefix="qwen3tts-warm-up") as pool:
                for done in [pool.submit(lambda: sum(1 for _ in self.synthesize(many))) for _ in range(streams)]:
                    done.result()
        elapsed = time.monotonic() - started
        _LOGGER.info("Warm-up synthesis took %.0f ms (%d at once)", elapsed * 1000, streams)
        t0 = time.monotonic()
        with self._session_lock:
            captured = self.backend.warm_up()  # the kernel backends' prefill graphs
        if captured:
            _LOGGER.info("Captured %d prefill graphs in %.0f ms", captured, (time.monotonic() - t0) * 1000)
            elapsed = time.monotonic() - started
        return elapsed

    def warm_thread(self) -> None:
        """Meet this thread's first CUDA work here rather than in a request: a prompt's text projection (cuBLAS in
        the model's dtype, on the thread's current stream). The server calls it on each synthesis thread before
        serving (TtsService._start_synthesis_threads)."""
        with torch.inference_mode():
            self.model.talker.embed_text([self.model.cfg.tts_pad_token_id])

    def synthesize_all(self, request: SynthesisRequest) -> tuple[bytes, np.ndarray]:
        """The whole utterance at once: (s16le PCM, codes [T, 16])."""
        pcm: list[bytes] = []
        codes: list[np.ndarray] = []
        for chunk in self.synthesize(request):
            pcm.append(chunk.pcm)
            codes.append(chunk.codes)
        all_codes = np.concatenate(codes) if codes else np.zeros((0, 16), dtype=np.int64)
        return b"".join(pcm), all_codes


def _stopped(why: str, text: str) -> None:
    """A sentence cut short by the runaway guard (its last chunk says so, for the front ends to count)."""
    _LOGGER.warning("Sentence stopped: %s: %r", why, text if len(text) <= 80 else text[:77] + "...")


def _log_first_chunk(session: DecodeSession, marks: list[float], pcm_at: float) -> None:
    """Debug: where a request's first chunk spent its time. marks: entered, text tokenized, prompt built. The
    batching backend's sessions carry their queue, admission and first-codes times; other sessions log the total
    only."""
    entered = marks[0]
    queued, admitted, codes = session.queued_at, session.admitted_at, session.first_codes_at
    if queued is None or admitted is None or codes is None or len(marks) != 3:
        _LOGGER.debug("First chunk after %.1f ms", (pcm_at - entered) * 1000)
        return
    tokenized, built = marks[1:]
    _LOGGER.debug(
        "First chunk after %.1f ms: prompt %.1f, queued %.1f, admitted to first codes %.1f, codec %.1f "
        "(prompt: text %.1f, build %.1f, start %.1f)",
        (pcm_at - entered) * 1000,
        (queued - entered) * 1000,
        (admitted - queued) * 1000,
        (codes - admitted) * 1000,
        (pcm_at - codes) * 1000,
        (tokenized - entered) * 1000,
        (built - tokenized) * 1000,
        (queued - built) * 1000,
    )


def next_group_size(previous: int, largest: int) -> int:
    """Frame groups double after the first until they reach `largest`: the first audio comes
    early, and a slower GPU still builds a buffer ahead of playback."""
    return min(largest, max(previous * 2, 1))
