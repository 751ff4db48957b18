"""A pool of device buffers for storage that outlives one graph call (saved activations).

Each compiled graph asks for the same sizes every call, so freed buffers are kept by size and
handed out again: after the first step no allocation reaches the driver. A :class:`Block` returns
its buffer to the pool when it is garbage-collected (when the tensor holding it dies).
"""

from __future__ import annotations

import threading
from collections import defaultdict

import pyopencl as cl

#: Sizes are rounded up to this many bytes so near-equal requests share blocks.
GRANULE = 256


class Block:
    """A pooled device buffer; it goes back to its pool when this object is collected."""

    __slots__ = ("__weakref__", "buffer", "consumed_by", "nbytes", "pool")

    def __init__(self, pool: BufferPool, buffer: cl.Buffer, nbytes: int) -> None:
        self.pool = pool
        self.buffer = buffer
        self.nbytes = nbytes
        #: The graph that reused these bytes after their last read (memory reuse), if one did:
        #: every tensor over the block (several saved views of one buffer) is then dead.
        self.consumed_by: str | None = None

    def __del__(self) -> None:
        self.pool._give_back(self.buffer, self.nbytes)


class BufferPool:
    def __init__(self, context: cl.Context) -> None:
        self.context = context
        self._free: dict[int, list[cl.Buffer]] = defaultdict(list)
        self._lock = threading.Lock()
        self.allocated_bytes = 0
        self.held_bytes = 0

    def allocate(self, nbytes: int) -> Block:
        size = max(GRANULE, (nbytes + GRANULE - 1) // GRANULE * GRANULE)
        with self._lock:
            free = self._free[size]
            if free:
                self.held_bytes -= size
                return Block(self, free.pop(), size)
            self.allocated_bytes += size
        return Block(self, cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size), size)

    def _give_back(self, buffer: cl.Buffer, size: int) -> None:
        with self._lock:
            self._free[size].append(buffer)
            self.held_bytes += size

    def release_free(self) -> None:
        """Hand buffers nobody uses back to the driver."""
        with self._lock:
            freed = sum(size * len(bufs) for size, bufs in self._free.items())
            self._free.clear()
            self.allocated_bytes -= freed
            self.held_bytes -= freed
