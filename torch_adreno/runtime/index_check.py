"""Device-side index checks reported to the host, like CUDA's asynchronous device-side asserts.

Kernels that index by tensor values (gather, scatter, embedding, advanced indexing, ...) check
every such index on the device (``kernels/index_check.cl``): a value out of range is replaced by
0, so nothing is read or written out of bounds, and the first failure is written into the
device's *index error record* (four ints: the failing launch's token, the check site, the value).
Nothing waits for that record on its own: it is read where the host waits for the device anyway
(an Executable call that reads outputs on the host, a synchronize, a replayed step's loss), only
if a checking kernel ran since the last clean read, and raised as eager's exception type.

What a failing call leaves: its results are not returned (the error is raised instead), and the
record is cleared after raising, so the next call starts clean. Device memory the failing call
wrote in place stays as computed with the bad index replaced by 0: on the compiled path a
training step stops at the forward's loss read, before its backward and optimizer run (the
parameters are untouched); a replayed TrainingStep enqueues the whole step before its one wait,
so its optimizer has already updated the parameters with that step's invalid gradients. An
error is never lost: until a read finds the record clean, every wait point reads it again.

The record also carries checks of values that are not indices (``ir.IndexCheck.value_message``):
``_assert_async`` (``one_hot``'s class range) and a ``histc`` range taken from data that is not
finite. They are raised the same way, as eager's RuntimeError with eager's message.

Invariant: a token is never 0 (0 marks a clean record); each token names one (graph, kernel).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from torch_adreno import ir

#: Ints in the error record: token, site, value low, value high.
RECORD_INTS = 4


class DeviceIndexOutOfRange(Exception):
    """An index a kernel read from a tensor was out of range, or a value a kernel checked failed
    its check (raised as eager's type, below)."""


class DeviceIndexError(DeviceIndexOutOfRange, IndexError):
    """Where eager raises ``IndexError`` (advanced indexing, index_put, index_select, embedding)."""


class DeviceIndexRuntimeError(DeviceIndexOutOfRange, RuntimeError):
    """Where eager raises ``RuntimeError`` (gather, scatter, scatter_add; value checks)."""


@dataclass(frozen=True)
class _Registered:
    graph: str
    #: The kernel (held, so that its ``id`` is not reused while registered).
    source: Any
    checks: tuple[ir.IndexCheck, ...]


class IndexErrorRecord:
    """The index error record of one device (one per :class:`~.device.DeviceRuntime`)."""

    def __init__(self, context: cl.Context) -> None:
        self._zeros = np.zeros(RECORD_INTS, dtype=np.int32)
        self.buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=self._zeros)
        self._host = np.zeros(RECORD_INTS, dtype=np.int32)
        self._lock = threading.Lock()
        self._tokens: dict[int, int] = {}
        self._registered: list[_Registered] = []
        #: Checking launches enqueued so far; the record is known clean up to :attr:`_clean_up_to`.
        self.launches = 0
        self._clean_up_to = 0
        self._read_at = 0

    def register(self, source: Any, graph: ir.Graph) -> None:
        """Give kernel ``source`` (a KernelSource of ``graph``) a token, once."""
        with self._lock:
            if id(source) not in self._tokens:
                self._registered.append(_Registered(graph.name, source, tuple(graph.index_checks)))
                self._tokens[id(source)] = len(self._registered)

    def bind(self, kernel: cl.Kernel, source: Any, first: int | None = None) -> None:
        """Bind the record and the token of ``source`` (registered) as ``kernel``'s arguments
        ``first`` and ``first + 1`` (by default its last two, after ``source.params``)."""
        token = self._tokens[id(source)]
        first = len(source.params) if first is None else first
        kernel.set_arg(first, self.buffer)
        kernel.set_arg(first + 1, np.int32(token))

    @property
    def unchecked(self) -> bool:
        """Whether a checking kernel was enqueued since the record was last read clean."""
        return self.launches != self._clean_up_to

    def enqueue_read(self, queue: cl.CommandQueue) -> cl.Event | None:
        """Start reading the record after everything enqueued on ``queue`` (None: nothing to read).
        Call :meth:`raise_if_set` once the event completed."""
        if not self.unchecked:
            return None
        self._read_at = self.launches
        return cl.enqueue_copy(queue, self._host, self.buffer, is_blocking=False)

    def check(self, queue: cl.CommandQueue) -> None:
        """Read the record now (a blocking read: for points where the host waits for ``queue``)."""
        event = self.enqueue_read(queue)
        if event is not None:
            event.wait()
            self.raise_if_set(queue)

    def raise_if_set(self, queue: cl.CommandQueue) -> None:
        """After a read on ``queue``: raise the recorded error, if any, having cleared the record."""
        token = int(self._host[0])
        if token == 0:
            self._clean_up_to = max(self._clean_up_to, self._read_at)
            return
        site, low, high = (int(v) for v in self._host[1:])
        value = (high << 32) | (low & 0xFFFFFFFF)
        # Cleared before raising: the error is reported once, and the next call starts clean.
        cl.enqueue_copy(queue, self.buffer, self._zeros, is_blocking=True)
        self._host[:] = 0
        self._clean_up_to = self.launches
        raise self._error(token, site, value)

    def _error(self, token: int, site: int, value: int) -> Exception:
        registered = self._registered[token - 1]
        check = registered.checks[site]
        origin = check.origin
        where = f"{origin.op} (FX node {origin.node} of graph {registered.graph}, kernel {registered.source.name}"
        where += f", {origin.source})" if origin.source else ")"
        low = -check.size if check.wraps else 0
        detail = (f"index {value} is out of bounds for dimension {check.dim} with size {check.size} "
                  f"(valid: {low} to {check.size - 1})")
        head = f"{check.eager_message}: {detail}" if check.eager_message else detail
        found = "Found on the device, where the index was replaced by 0"
        if check.value_message is not None:
            head, found = check.value_message, "Found on the device"
        message = (f"{head}, in {where}. {found}: the results of "
                   f"this call are invalid and were not returned (in a replayed TrainingStep the step's "
                   f"optimizer update was already applied; restore the parameters from a checkpoint).")
        cls: type[Exception] = DeviceIndexError if check.error == "IndexError" else DeviceIndexRuntimeError
        return cls(message)


__all__ = ["DeviceIndexError", "DeviceIndexOutOfRange", "DeviceIndexRuntimeError", "IndexErrorRecord"]
