"""How the daemon's process is tuned: open files, the allocator, garbage collection.

Each rule here was measured; the numbers, and the commands that give them, are in
docs/design.md ("The process is tuned for many idle sessions").
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import resource
from collections.abc import Callable

from bridge import logs

# A collection walks every object it tracks: with 10,000 open sessions a full one
# pauses the daemon for hundreds of ms. So every second the collector looks only at
# what was allocated since its last look, and what survives is frozen out of its
# reach (still freed by reference counting when it goes).
GC_FREEZE_INTERVAL_S = 1.0
# Frozen objects that end up in a cycle are only reclaimed by a walk over everything.
# Every closed connection leaves one (CPython's socket transport refers to itself),
# and so do some closed sessions: about 2 KiB each. So a full walk comes once as many
# connections and sessions have come as there are sessions open (at least FULL_AFTER),
# which bounds that garbage by what live sessions hold and the walks' cost per
# connection; and every GC_FULL_EVERY seconds regardless.
FULL_AFTER = 512
GC_FULL_EVERY = 600
# Allocations between young collections (Python's default: 700): per-message objects
# die young and are freed by reference counting, so collecting them that often is waste.
GC_YOUNG_THRESHOLD = 10_000
# glibc malloc, left to itself, gives the heap back to the system after each large
# message and takes it again for the next, and every page it takes is faulted in
# afresh: with 1 MiB messages that was a third of the time per call. Buffers up to
# this size come from the heap, and up to TRIM_THRESHOLD of free heap is kept.
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 16 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from malloc.h


def raise_open_file_limit() -> None:
    """Each SSE session holds a socket: take as many descriptors as the system allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    logs.get().info("open_file_limit", soft=soft, hard=hard)


def tune_allocator() -> None:
    """Keep large-message buffers in the heap (see MMAP_THRESHOLD); glibc only, and
    never over the MALLOC_*_ environment variables, which say the operator chose."""
    if any(k in os.environ for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")):
        return
    try:
        libc = ctypes.CDLL(None)
        tuned = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    except (OSError, AttributeError):
        tuned = False
    logs.get().info("allocator", tuned=tuned, mmap_threshold=MMAP_THRESHOLD, trim_threshold=TRIM_THRESHOLD)


async def keep_collections_short(arrivals: Callable[[], int], sessions: Callable[[], int]) -> None:
    """The collection policy above. `arrivals`: connections accepted plus sessions
    opened so far (a running total); `sessions`: how many are open now."""
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
    since_full = 0.0
    seen = arrivals()
    while True:
        gc.collect(1)
        gc.freeze()
        await asyncio.sleep(GC_FREEZE_INTERVAL_S)
        since_full += GC_FREEZE_INTERVAL_S
        if arrivals() - seen >= max(FULL_AFTER, sessions()) or since_full >= GC_FULL_EVERY:
            gc.unfreeze()
            gc.collect()
            since_full, seen = 0.0, arrivals()
