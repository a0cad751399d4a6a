"""Process-wide memory concerns: the garbage collector's pauses and the accelerator's cached memory.

- `watch_collections` (called once by __main__) warns when a collection stops every thread for
  GC_WARN_MS or more: a stall that no request's timeline shows. Not while the model loads (`loading`):
  the load makes ~300,000 objects, and its full collections of 50-150 ms (seen on the CPU) stall no request.
- `freeze_loaded`: after the model load, one full collection of the process's own (not warned), then
  everything alive set out of the collector's sight, so later full collections walk only what
  requests make.
- `release_gpu_memory`: drop unreferenced tensors and hand the allocator's cached blocks back.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_LOGGER = logging.getLogger(__name__)

GC_WARN_MS = 20
_collection_started: list[float] = []  # when the collection in progress began
_deliberate = threading.local()  # .on: this thread's own gc.collect(), logged by its caller
_loads = [0]  # model loads in progress (any thread): their collections are expected


@contextmanager
def loading() -> Iterator[None]:
    """While the model loads: long collections are expected, not warned."""
    _loads[0] += 1
    try:
        yield
    finally:
        _loads[0] -= 1


def _warn_long_collection(phase: str, info: dict[str, int]) -> None:
    """gc callback: warn when a collection stops every thread for long."""
    if getattr(_deliberate, "on", False) or _loads[0]:
        return
    if phase == "start":
        _collection_started[:] = [time.monotonic()]
    elif _collection_started:
        ms = (time.monotonic() - _collection_started[0]) * 1000
        if ms >= GC_WARN_MS:
            _LOGGER.warning(
                "Garbage collection of generation %s paused every thread for %.0f ms", info.get("generation"), ms
            )


def watch_collections() -> None:
    """Register the long-collection warning; once per process however often called."""
    if _warn_long_collection not in gc.callbacks:
        gc.callbacks.append(_warn_long_collection)


def freeze_loaded() -> None:
    """Collect the load's garbage (logged, not warned) and freeze what lives on."""
    started, _deliberate.on = time.monotonic(), True
    try:
        gc.collect()
        gc.freeze()
    finally:
        _deliberate.on = False
    _LOGGER.info(
        "Collected the load's garbage and set %d objects out of the collector's sight in %.0f ms",
        gc.get_freeze_count(),
        (time.monotonic() - started) * 1000,
    )


def release_gpu_memory() -> None:
    """Drop unreferenced tensors and hand the allocator's cached blocks back to the driver."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
