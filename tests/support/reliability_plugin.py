"""Test-only launcher: the real server command line plus fault injection and introspection.

Run as `python tests/support/reliability_plugin.py <server args>`; environment variables choose:

- Q3T_TEST_ENGINE=fake: fake_engine.FakeEngine (one 80 ms frame per word, Q3T_TEST_FRAME_DELAY
  seconds each) instead of loading --model.
- Faults, triggered by a marker word in a sentence's text (the engine sees sentences):
  `raiseengineerror` raises RuntimeError after the first audio chunk, `forcegpuoom` raises
  torch.cuda.OutOfMemoryError before any audio, `realgpuoom` allocates more than the GPU has
  (a real out-of-memory), `bigaudio` makes every frame 8 frames long (lots of audio, fast).
- An extra event `x-test-stats` answered with the process's threads, asyncio tasks, open
  exchanges and connections, RSS, GPU memory, and every file path opened (Python audit hook)
  since the model finished loading.  Nothing of this exists in the shipped server.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import torch
from wyoming.event import Event

from wyoming_qwen3tts import __main__ as server_main
from wyoming_qwen3tts.handler import Qwen3TTSEventHandler

OPENED: list[str] = []
_RECORD = threading.Event()  # set once the model is loaded: record the paths requests open
_IN_STATS = threading.local()


def _audit(event: str, args: tuple) -> None:  # type: ignore[type-arg]
    if event == "open" and _RECORD.is_set() and not getattr(_IN_STATS, "active", False):
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)):
            OPENED.append(os.fsdecode(path))


sys.addaudithook(_audit)


def _out_of_memory_inside(engine: object) -> None:
    """The OOM markers fire inside the engine's synthesis (its prompt step), where the engine handles them."""
    prepare = engine._prepare  # type: ignore[attr-defined]

    def faulty_prepare(request, marks=None):  # type: ignore[no-untyped-def]
        text = request.text.lower()
        if "forcegpuoom" in text:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (forced by the test)")
        if "realgpuoom" in text:
            free, total = torch.cuda.mem_get_info()
            hog = torch.empty(int(total) * 2, dtype=torch.uint8, device="cuda")  # more than the GPU has
            del hog
        return prepare(request, marks)

    engine._prepare = faulty_prepare  # type: ignore[attr-defined]


def _with_faults(engine: object) -> object:
    if hasattr(engine, "_prepare"):  # a real Engine (the fake one has no GPU to run out of)
        _out_of_memory_inside(engine)
    synthesize = engine.synthesize  # type: ignore[attr-defined]

    def faulty(request, cancel=None):  # type: ignore[no-untyped-def]
        text = request.text.lower()
        for i, chunk in enumerate(synthesize(request, cancel)):
            if "bigaudio" in text:
                chunk = type(chunk)(pcm=chunk.pcm * 8, codes=chunk.codes.repeat(8, axis=0))
            yield chunk
            if i == 0 and "raiseengineerror" in text:
                raise RuntimeError("injected engine failure after the first chunk")

    engine.synthesize = faulty  # type: ignore[attr-defined]
    return engine


_load_engine = server_main.load_engine


def load_engine(settings, voices=None):  # type: ignore[no-untyped-def]
    if os.environ.get("Q3T_TEST_ENGINE") == "fake":
        from fake_engine import FakeEngine  # beside this script: its folder is on sys.path

        engine = FakeEngine(frame_delay=float(os.environ.get("Q3T_TEST_FRAME_DELAY", "0.002")))
    else:
        engine = _load_engine(settings, voices)
    _RECORD.set()
    return _with_faults(engine)


server_main.load_engine = load_engine


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


_dispatch = Qwen3TTSEventHandler._dispatch


async def _dispatch_with_stats(self: Qwen3TTSEventHandler, event: Event) -> bool:
    if event.type != "x-test-stats":
        return await _dispatch(self, event)
    _IN_STATS.active = True
    try:
        stats = {
            "threads": threading.active_count(),
            "os_threads": _status("Threads"),
            "tasks": len(asyncio.all_tasks()),
            "exchanges": len(self.service._tasks),
            "connections": len(self.service.connections),
            "rss_kb": _status("VmRSS"),
            "jobs": self.service.jobs_running,
            "opened": list(OPENED),
            "cuda_reserved": torch.cuda.memory_reserved() if torch.cuda.is_available() else 0,
            "cuda_allocated": torch.cuda.memory_allocated() if torch.cuda.is_available() else 0,
            "time": time.time(),
        }
    finally:
        _IN_STATS.active = False
    await self.write_event(Event(type="x-test-stats", data=stats))
    return True


Qwen3TTSEventHandler._dispatch = _dispatch_with_stats  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv[0] = "wyoming-qwen3tts"
    server_main.run()
