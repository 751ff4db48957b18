"""How a replayed step puts each new batch, and fresh random seeds, where its kernels read them.

Three ways (:class:`BatchMode`), chosen per device and residency when the replay is built:

- ``IN_PLACE`` (unified memory, zero-copy): each replay makes a host-pointer buffer over the batch's
  own memory and binds it to the kernels that read it; nothing is copied;
- ``STAGED`` (a device with memory of its own): the batch is copied into pinned staging memory,
  mapped once for the replay's lifetime, and uploaded asynchronously with the seeds in one write
  (a driver stages pageable memory itself, synchronously, and charges each write's enqueue);
- ``UPLOADED`` (zero-copy off on unified memory): each argument is written from its own memory.

Staged or uploaded, a replay that returns before the device has finished its step
(:mod:`torch_adreno.replay.overlap`) has the next step's batch and seeds written into a second
device buffer, the *landing*, on a queue of their own, while the device still runs the previous
step and reads the arena's copy; the step then copies the landing into the arena on its own queue,
after the previous step (:meth:`BatchInput.land`).

Invariant: the bytes a replay's kernels read for a batch argument are that replay's batch (the
caller has checked the batch's geometry against the capture's), and the seeds are drawn from
torch's default generator in the capture's order, as the compiled path draws them.
"""

from __future__ import annotations

import enum
import functools
import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyopencl as cl
import torch

from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.enqueue import write_buffer
from torch_adreno.runtime.events import BUS
from torch_adreno.runtime.residency import host_array, shared_buffer

#: The graph name a replay's own transfers and launches are reported under.
REPLAY_GRAPH = "replayed_step"
#: Staged batches of at least this many bytes are copied into the staging memory by worker threads
#: while the step's guard runs on the caller's thread (:meth:`BatchInput.prestage`): the device
#: idles until the batch is there. A batch of several MB takes about as long to copy on one thread
#: as the guard takes to run, and less on two or more; the workers (:data:`COPY_THREADS`) stop at
#: four, where the host has them, leaving the caller's thread a core of its own for the guard (more
#: threads make the batch phase of ``ReplayedStep.last_phases`` longer again).
#: A worker copies without Python's lock (``np.copyto`` releases it) but needs the lock to start,
#: and the guard, pure Python, holds it until it ends: a worker that has not started by then copies
#: after the guard, not beside it. :meth:`BatchInput.prestage` returns only once every worker has
#: started its copy.
PRESTAGE_BYTES = 1 << 20
COPY_THREADS = max(1, min(4, (os.cpu_count() or 1) - 1))


def _copy_pool() -> ThreadPoolExecutor:
    """The workers, :data:`COPY_THREADS` of them (each share of a batch starts at once: see there)."""
    return _pool_of(COPY_THREADS)


@functools.cache
def _pool_of(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="torch_adreno_batch")


class BatchMode(enum.Enum):
    IN_PLACE = "in place"
    STAGED = "staged"
    UPLOADED = "uploaded"


def batch_mode(zero_copy: bool, unified_memory: bool, arguments_fixed: bool = False) -> BatchMode:
    """How a replay puts the batch in place on a device (see the module docstring).
    ``arguments_fixed``: the kernels' arguments stay as first bound (an image is made over a buffer
    once, at binding, and a recording in the driver keeps the arguments it was recorded with): a
    batch bound anew each step would need new images, or a new recording, each step, so it goes
    into the replay's own memory instead."""
    if unified_memory:
        return BatchMode.IN_PLACE if zero_copy and not arguments_fixed else BatchMode.UPLOADED
    return BatchMode.STAGED


@dataclass
class BatchBinding:
    """One batch identity of the recording: which argument, and where a replay puts it."""

    position: int
    #: as_strided geometry when the bound view differs from the batch argument itself.
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None
    nbytes: int
    label: str
    #: The replay's own device buffer the batch is uploaded into (None: bound in place), and
    #: where in it.
    buffer: cl.Buffer | None
    offset: int = 0
    #: Staged: the pinned staging memory, mapped for the replay's lifetime, as bytes.
    staging: np.ndarray | None = None
    #: In place: the (kernel, argument index) pairs that read the batch.
    consumers: list[tuple[cl.Kernel, int]] = field(default_factory=list)

    def tensor_of(self, batch: tuple[Any, ...]) -> torch.Tensor:
        tensor = batch[self.position]
        return tensor if self.view is None else tensor.as_strided(*self.view)


def _copy_pieces(started: threading.Semaphore, pieces: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """A worker's share of a prestaged batch: each ``(target, source)`` piece copied, the largest
    first (between two pieces the worker needs Python's lock, which the guard may hold), after
    telling the caller it has started (:data:`COPY_THREADS`)."""
    started.release()
    for target, source in pieces:
        np.copyto(target, source)


def _unmap_all(maps: list[Any], queue: cl.CommandQueue) -> None:
    for mapping in maps:
        mapping.release(queue)
    queue.finish()


class BatchInput:
    """The batch arguments and seeds of one replayed step (see the module docstring).

    ``bindings`` come from the recording; ``seed_offsets`` are the seeds' byte offsets in
    ``arena``. Staged, the batch and seeds are placed after the step's own slots, and one pinned
    buffer mirrors the arena's bytes from the first of them to the last."""

    def __init__(self, runtime: DeviceRuntime, queue: cl.CommandQueue, mode: BatchMode,
                 bindings: list[BatchBinding], arena: cl.Buffer, seed_offsets: list[int]) -> None:
        self.runtime = runtime
        self.mode = mode
        self.bindings = bindings
        self._queue = queue
        self._arena = arena
        self._seeds = seed_offsets
        self._staging_buffers: list[cl.Buffer] = []
        self._staging_maps: list[Any] | None = None
        # In place: the host-pointer buffers bound by the last replay, with the memory under them;
        # kept until the next replay binds others, so no kernel points at a released buffer.
        self._bound: list[tuple[cl.Buffer, Any]] = []
        self._tail: np.ndarray | None = None
        self._tail_start = 0
        self._seed_slots: list[torch.Tensor] = []
        #: Landing (see the module docstring): its buffer, the queue writing it, the last write's event.
        self._landing: cl.Buffer | None = None
        self._upload_queue: cl.CommandQueue | None = None
        self._landed: cl.Event | None = None
        self._landing_start = 0
        #: Steps whose batch and seeds went through the landing buffer.
        self.landed_steps = 0
        #: Copies of a prestaged batch in flight (their sources kept alive beside them).
        self._pending: list[Future[None]] = []
        self._pending_sources: list[np.ndarray] = []
        if mode is BatchMode.STAGED:
            spans = [(b.offset, b.nbytes) for b in bindings if b.nbytes] + [(at, 8) for at in seed_offsets]
            if spans:
                self._tail_start = min(at for at, _ in spans)
                self._tail = self._staging(max(at + n for at, n in spans) - self._tail_start)
                for binding in bindings:
                    if binding.nbytes:
                        at = binding.offset - self._tail_start
                        binding.staging = self._tail[at:at + binding.nbytes]
                self._seed_slots = [torch.from_numpy(self._tail[at - self._tail_start:at - self._tail_start + 8]
                                                     .view(np.int64)).reshape(()) for at in seed_offsets]

    @property
    def staging_buffers(self) -> int:
        return len(self._staging_buffers)

    @property
    def arena(self) -> cl.Buffer:
        """The arena buffer holding the copied batch and the seeds."""
        return self._arena

    def _span(self) -> tuple[int, int]:
        """The arena's bytes from the first batch argument or seed to the end of the last."""
        spans = [(b.offset, b.nbytes) for b in self.bindings if b.nbytes] + [(at, 8) for at in self._seeds]
        if not spans:
            return 0, 0
        start = min(at for at, _ in spans)
        return start, max(at + n for at, n in spans) - start

    def land(self, upload_queue: cl.CommandQueue) -> tuple[cl.Buffer, int, int] | None:
        """From now on, :meth:`bind` and :meth:`upload_seeds` with ``landing`` write into a device
        buffer of their own on ``upload_queue``. Returns that buffer, the arena offset its bytes
        belong at and their size: the step copies it there on its own queue after the previous
        step (the caller's operation, before the first kernel); None where the step has no batch
        argument or seed to land. Copy modes only (``STAGED``, ``UPLOADED``)."""
        if self.mode is BatchMode.IN_PLACE:
            raise ValueError("a batch bound in place is not uploaded: it has nothing to land")
        start, nbytes = self._span()
        if not nbytes:
            return None
        self._landing = cl.Buffer(self.runtime.context, cl.mem_flags.READ_WRITE, nbytes)
        self._landing_start = start
        self._upload_queue = upload_queue
        return self._landing, start, nbytes

    def _target(self, landing: bool, buffer: cl.Buffer | None, offset: int) -> tuple[cl.CommandQueue | None,
                                                                                        cl.Buffer, int]:
        """Where a write of the arena's bytes at ``offset`` goes: the landing buffer on the upload
        queue, or ``buffer`` on the step's queue (None: the caller's)."""
        if not landing:
            assert buffer is not None
            return None, buffer, offset
        assert self._landing is not None and self._upload_queue is not None, "land() first"
        return self._upload_queue, self._landing, offset - self._landing_start

    def wait_for_landing(self, queue: cl.CommandQueue) -> None:
        """Make ``queue`` wait for this step's writes into the landing buffer (they run meanwhile on
        the upload queue, handed to the device now)."""
        if self._landed is None:
            return
        assert self._upload_queue is not None
        self._upload_queue.flush()
        cl.enqueue_barrier(queue, wait_for=[self._landed])
        self._landed = None
        self.landed_steps += 1

    @property
    def staged_seeds(self) -> int:
        return len(self._seed_slots)

    def _staging(self, nbytes: int) -> np.ndarray:
        """Pinned host memory of ``nbytes``: a host-allocated buffer mapped once. A write from it
        is a DMA the host does not wait for; one from pageable memory is staged by the driver."""
        buffer = cl.Buffer(self.runtime.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
        flags: Any = cl.map_flags.WRITE | cl.map_flags.READ
        mapped: Any = cl.enqueue_map_buffer(self._queue, buffer, flags, 0,
                                            (nbytes,), np.dtype(np.uint8), is_blocking=True)
        self._staging_buffers.append(buffer)
        array: np.ndarray = mapped[0]
        if self._staging_maps is None:
            self._staging_maps = []
            # Unmapped when the replay goes (a recapture, an evicted geometry), not left to the
            # order in which the collector frees buffer and mapping.
            weakref.finalize(self, _unmap_all, self._staging_maps, self._queue)
        self._staging_maps.append(array.base)
        return array

    def prestage(self, batch: tuple[Any, ...]) -> None:
        """Start copying ``batch`` into the staging memory on worker threads (staged batches of at
        least :data:`PRESTAGE_BYTES`; otherwise nothing): the caller checks the step's guard
        meanwhile, then :meth:`bind` waits for the copies, or :meth:`settle` if the replay is not
        run. The previous replay's upload from the staging memory has finished (its loss read
        waited for the queue)."""
        self.settle()
        staged = [b for b in self.bindings if b.staging is not None]
        if self._tail is None or sum(b.nbytes for b in staged) < PRESTAGE_BYTES:
            return
        shares: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(COPY_THREADS)]
        for binding in staged:
            assert binding.staging is not None
            source = host_array(binding.tensor_of(batch)).reshape(-1).view(np.uint8)
            self._pending_sources.append(source)
            step = -(-source.size // COPY_THREADS)
            for share, start in zip(shares, range(0, source.size, step), strict=False):
                share.append((binding.staging[start:start + step], source[start:start + step]))
        pool, started = _copy_pool(), threading.Semaphore(0)
        shares = [sorted(share, key=lambda piece: -piece[1].size) for share in shares if share]
        self._pending = [pool.submit(_copy_pieces, started, share) for share in shares]
        for _ in shares:
            started.acquire()  # (without Python's lock, which the workers need to start)

    def settle(self) -> None:
        """Wait for a prestaged batch's copies (raising what one raised); nothing if none is in flight."""
        pending, self._pending = self._pending, []
        try:
            for future in pending:
                future.result()
        finally:
            for future in pending:  # (after an error, the others still finish before the memory is reused)
                future.exception()
            self._pending_sources = []

    def bind(self, batch: tuple[Any, ...], queue: cl.CommandQueue, keep: list[Any], landing: bool = False) -> None:
        """Put ``batch`` (and, staged, fresh seeds) where the kernels read it, on ``queue``; host
        memory the enqueued writes still read is appended to ``keep``. ``landing``: write into the
        landing buffer instead (:meth:`land`; then :meth:`wait_for_landing`)."""
        record = BUS.active
        if self.mode is BatchMode.IN_PLACE:
            bound: list[tuple[cl.Buffer, Any]] = []
            for binding in self.bindings:
                view = binding.tensor_of(batch)
                # A buffer made over the memory as it is now (what a device caches of host memory
                # is defined at creation): nothing is copied on a unified-memory device. (This was
                # once turned off after crashes in long PoCL runs; their cause was the capture
                # taking a released buffer's reused handle for another identity, since fixed:
                # tests/replay/test_replay.py's fresh-tensor, dropout and interleaved tests guard it.)
                buffer = shared_buffer(self.runtime, view)
                bound.append((buffer, view))
                for kernel, position in binding.consumers:
                    kernel.set_arg(position, buffer)
                if record:
                    BUS.transfer(REPLAY_GRAPH, "h2d", binding.nbytes, binding.label, "input", copied=False)
            self._bound = bound  # the previous replay's buffers are released here, unused
            return
        if self._tail is not None:
            # Staged. The previous replay's upload has finished (its loss read waited for the queue).
            if self._pending:
                self.settle()  # prestaged while the guard ran
            else:
                for binding in self.bindings:
                    if binding.staging is not None:
                        np.copyto(binding.staging, host_array(binding.tensor_of(batch)).reshape(-1).view(np.uint8))
            for slot in self._seed_slots:
                # As the full path draws them (Executable), into the pinned bytes the write sends.
                torch.randint(0, 2**62, (), dtype=torch.int64, out=slot)
            upload_queue, target, at = self._target(landing, self._arena, self._tail_start)
            written: cl.Event | None = write_buffer(upload_queue or queue, target, self._tail, at)
            if landing:
                self._landed = written
            if record:
                for binding in self.bindings:
                    BUS.transfer(REPLAY_GRAPH, "h2d", binding.nbytes, binding.label, "input", event=written)
                    written = None  # (the one write's time is reported once)
                for _ in self._seed_slots:
                    BUS.transfer(REPLAY_GRAPH, "h2d", 8, "seed", "input")
            return
        for binding in self.bindings:
            if landing and not binding.nbytes:
                continue
            array = host_array(binding.tensor_of(batch))
            keep.append(array)
            upload_queue, target, at = self._target(landing, binding.buffer, binding.offset)  # (not in place)
            event = write_buffer(upload_queue or queue, target, array, at)
            if landing:
                self._landed = event
            if record:
                BUS.transfer(REPLAY_GRAPH, "h2d", binding.nbytes, binding.label, "input", event=event)

    def upload_seeds(self, queue: cl.CommandQueue, keep: list[Any], landing: bool = False) -> None:
        """Fresh seeds into their arena slots (staged: already sent with the batch); ``landing``:
        into the landing buffer, as :meth:`bind`."""
        if self._tail is not None:
            return
        for offset in self._seeds:
            # As the full path draws them (Executable): torch.manual_seed(n) makes replays repeat too.
            seed = host_array(torch.randint(0, 2**62, (), dtype=torch.int64))
            keep.append(seed)
            upload_queue, target, at = self._target(landing, self._arena, offset)
            event = write_buffer(upload_queue or queue, target, seed, at)
            if landing:
                self._landed = event
            BUS.transfer(REPLAY_GRAPH, "h2d", seed.nbytes, "seed", "input")
