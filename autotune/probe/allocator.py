"""PyTorch's CUDA caching allocator, simulated on the estimator's recorded allocations (no GPU needed).

``max_memory_reserved`` is not the sum of live tensors: the allocator takes memory from the driver in
segments and keeps freed blocks cached. Given the order in which a step allocates and frees its
storages (``MemoryTracker.record``), what it reserves follows from its rules, which this module
applies as PyTorch's native allocator (``c10/cuda/CUDACachingAllocator.cpp``, expandable segments off,
no ``max_split_size_mb``, no rounding to powers of two) does:

- every request is rounded up to 512 bytes (``kMinBlockSize``);
- requests of at most 1 MiB (``kSmallSize``) are served from the small pool, whose segments are
  2 MiB (``kSmallBuffer``); larger ones from the large pool, whose new segments are 20 MiB
  (``kLargeBuffer``) for requests under 10 MiB (``kMinLargeAlloc``), else the request rounded up to
  2 MiB (``kRoundLarge``);
- a request takes the smallest cached free block of its pool that holds it (best fit, lowest
  address among equal sizes) and splits off the rest when the rest is at least 512 bytes (small
  pool) or more than 1 MiB (large pool); only when no cached block holds it is a segment added;
- a freed block merges with free neighbours of its own segment and stays cached (reserved);
- ``empty_cache`` returns every segment that is wholly free.

With ``expandable_segments`` the large pool is one segment per stream that grows in 20 MiB pages and
the cached tail is reused by any size (no fragmentation between segments): ``Allocator(expandable=True)``
models it as a best-fit over pages, which over-states nothing a real expandable segment would not hold.

What a step allocates beyond the counted storages (cuDNN's workspaces) is added by the caller as a
transient request (``transient``); the simulation then says where it lands and what it costs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["Allocator", "round_size", "segment_size", "SMALL_SIZE", "SMALL_BUFFER", "LARGE_BUFFER",
           "MIN_LARGE_ALLOC", "ROUND_LARGE", "MIN_BLOCK"]

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    """A request's block size: at least 512 bytes, a multiple of 512."""
    nbytes = int(nbytes)
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment ``cudaMalloc`` gets for a rounded request that no cached block holds."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


@dataclass
class Allocator:
    """The caching allocator's state: segments, cached free blocks, and the peaks of what it holds.

    ``malloc(key, nbytes)`` and ``free(key)`` name a block by any hashable ``key``; ``allocated`` and
    ``reserved`` (and their peaks, ``reset_peaks``) are what ``torch.cuda.memory_allocated`` and
    ``memory_reserved`` report. ``expandable``: the ``expandable_segments:True`` setting.
    """

    expandable: bool = False
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    _free: dict[bool, list[tuple[int, int, int]]] = field(default_factory=lambda: {True: [], False: []})
    _by_key: dict[tuple[int, int, int], _Block] = field(default_factory=dict)
    _live: dict[object, _Block] = field(default_factory=dict)
    _segment_size: dict[int, int] = field(default_factory=dict)

    def malloc(self, key: object, nbytes: int) -> None:
        """Allocate ``nbytes`` for ``key`` (0 bytes allocates nothing, as CUDA's allocator)."""
        if nbytes <= 0:
            return
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._take(size, small)
        if block is None:
            block = self._grow(size, small)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: object) -> None:
        """Free ``key``'s block (unknown keys are ignored: a storage of 0 bytes, or another device's)."""
        block = self._live.pop(key, None)
        if block is None:
            return
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._unlist(neighbour)
                block = self._merge(block, neighbour)
        self._list(block)

    def rename(self, key: object, new_key: object) -> None:
        """Name ``key``'s block ``new_key`` (a storage that outlives the step that made it)."""
        self._live[new_key] = self._live.pop(key)

    def transient(self, nbytes: int) -> None:
        """Allocate and free at once (a workspace a kernel holds while it runs)."""
        key = object()
        self.malloc(key, nbytes)
        self.free(key)

    def empty_cache(self) -> None:
        """Return every wholly free segment to the driver."""
        for small in (True, False):
            for entry in list(self._free[small]):
                block = self._by_key[entry]
                if block.prev is None and block.next is None:
                    self._unlist(block)
                    self.reserved -= block.size
                    del self._segment_size[block.segment]

    def reset_peaks(self) -> None:
        """Start the peaks from what is held now (``torch.cuda.reset_peak_memory_stats``)."""
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    # -- internals ------------------------------------------------------------------------------
    def _take(self, size: int, small: bool) -> _Block | None:
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size, -1, -1))
        if index == len(pool):
            return None
        block = self._by_key[pool[index]]
        self._unlist(block)
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            tail = _Block(block.segment, block.offset + size, rest, small, False, block, block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._list(tail)
        return block

    def _grow(self, size: int, small: bool) -> _Block:
        total = segment_size(size)
        if self.expandable and not small:  # pages of 20 MiB appended to one growing segment
            total = -(-size // LARGE_BUFFER) * LARGE_BUFFER
        self.segments += 1
        segment = self.segments
        self._segment_size[segment] = total
        self.reserved += total
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        block = _Block(segment, 0, total, small)
        if total - size > 0 and ((total - size >= MIN_BLOCK) if small else (total - size > SMALL_SIZE)):
            tail = _Block(segment, size, total - size, small, False, block, None)
            block.next, block.size = tail, size
            self._list(tail)
        return block

    def _merge(self, a: _Block, b: _Block) -> _Block:
        first, second = (a, b) if a.offset < b.offset else (b, a)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    def _list(self, block: _Block) -> None:
        key = block.key()
        self._by_key[key] = block
        bisect.insort(self._free[block.small], key)

    def _unlist(self, block: _Block) -> None:
        key = block.key()
        pool = self._free[block.small]
        index = bisect.bisect_left(pool, key)
        del pool[index]
        del self._by_key[key]
