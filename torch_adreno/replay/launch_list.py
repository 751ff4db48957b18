"""A fixed list of device operations on one queue, enqueued in order with as little host work as
the driver allows.

A replayed step (:mod:`torch_adreno.replay.step`) is such a list: launches of kernels whose
arguments are bound once, buffer copies, buffer fills (``fill_uninitialized_memory``) and flushes.
Enqueued from Python, each costs ~1-2 us of interpreter and pyopencl work (argument conversion, an
event object per call) on top of the driver's own enqueue. So runs of them go to a small C loop
(``launch_list.c``, built by :mod:`.native_loop`) in one ctypes call, which calls the driver's entry
points directly and asks for no events; where the driver can record them (a
``cl_khr_command_buffer``, :mod:`.driver_recording`), each run is recorded once and a step enqueues
the recording, one call instead of one per operation. Operations neither knows (an image refresh,
a read of the loss) stay Python callables between the runs.

Where the C loop cannot be built or loaded, the same operations are enqueued from Python, in the
same order (bit-identical results), and :func:`native_loop_status` says why; a warning says so
once, the first time a list is enqueued that way. ``TORCH_ADRENO_NATIVE_LOOP=0`` chooses the
Python loop.
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

from torch_adreno.replay.driver_recording import (
    COMMAND_BUFFER,
    DriverRecording,
    RecordedRuns,
    RecordingRefused,
)
from torch_adreno.replay.native_loop import COPY, FILL, FLUSH, LAUNCH, native_loop, native_loop_status
from torch_adreno.replay.native_loop import Operation as _Operation
from torch_adreno.runner.format import FILL_PATTERN, fill_commands
from torch_adreno.runtime.enqueue import copy_buffer_call, fill_buffer_call

__all__ = ["Copy", "Fill", "Flush", "Launch", "LaunchError", "LaunchList", "native_loop", "native_loop_status"]

#: The fill pattern's bytes, and its first byte alone (an odd last byte), as the C loop reads them:
#: alive as long as the module (the loop's records point into them).
_PATTERNS = {pattern: ctypes.create_string_buffer(pattern, len(pattern)) for pattern in (FILL_PATTERN, FILL_PATTERN[:1])}


class LaunchError(RuntimeError):
    """The driver refused an operation of a launch list; the message names it and the error."""


@dataclass(frozen=True)
class Launch:
    """A kernel launch; the kernel's arguments are bound before the list is enqueued. ``name``: the
    kernel's own (``KernelSource.name``), what an error names; "" for the kernel object's function.
    (Kernels of equal content run one function of their program, named by the first of them: a
    deduplicated kernel's ``function_name`` is another kernel's symbol.)"""

    kernel: cl.Kernel
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    name: str = ""

    def describe(self) -> str:
        """``kernel <name>``, with the program function that runs it where that is named otherwise."""
        function = self.kernel.function_name
        if not self.name or self.name == function:
            return f"kernel {function}"
        return f"kernel {self.name} (program function {function})"


@dataclass(frozen=True)
class Copy:
    """``nbytes`` from ``source`` at ``source_offset`` to ``destination`` at ``destination_offset``."""

    source: cl.Buffer
    destination: cl.Buffer
    source_offset: int
    destination_offset: int
    nbytes: int


@dataclass(frozen=True)
class Fill:
    """``nbytes`` of ``buffer`` from ``offset`` filled with ``pattern`` repeated (both multiples of
    its length): one ``clEnqueueFillBuffer``. :meth:`of` makes those of ``fill_uninitialized_memory``."""

    buffer: cl.Buffer
    offset: int
    nbytes: int
    pattern: bytes = FILL_PATTERN

    def __post_init__(self) -> None:
        if self.pattern not in _PATTERNS or self.offset % len(self.pattern) or self.nbytes % len(self.pattern):
            raise ValueError(f"a fill of {self.nbytes} bytes at {self.offset} with pattern {self.pattern!r}: "
                             f"the pattern is one of {list(_PATTERNS)}, offset and size multiples of its length")

    @staticmethod
    def of(buffer: cl.Buffer, offset: int, nbytes: int) -> list[Fill]:
        """The fills that write the pattern of ``fill_uninitialized_memory`` over ``nbytes`` of
        ``buffer`` from ``offset`` (:func:`torch_adreno.runner.format.fill_commands`)."""
        return [Fill(buffer, start, size, pattern) for start, size, pattern in fill_commands(offset, nbytes)]


@dataclass(frozen=True)
class Flush:
    """Hand what is enqueued so far to the device."""


Operation = Launch | Copy | Fill | Flush | Callable[[cl.CommandQueue], Any]
#: The operations the C loop runs itself.
_NATIVE_KINDS = (Launch, Copy, Fill, Flush)
#: What a call of a step is: a run of the C loop, a recording in the driver, a Python operation.
_RUN, _RECORDED, _PYTHON = "run", "recorded", "python"


@functools.cache
def _warn_python_loop(reason: str) -> None:
    warnings.warn(f"torch_adreno: replayed steps enqueue their launches from Python: {reason}. "
                  "Results are the same; the host pays ~1-2 us more per launch.", RuntimeWarning, stacklevel=3)


def _python_call(queue: cl.CommandQueue, operation: Operation) -> Callable[[], Any]:
    if isinstance(operation, Fill):
        return fill_buffer_call(queue, operation.buffer, operation.pattern, operation.offset, operation.nbytes)
    if isinstance(operation, Launch):
        return functools.partial(cl.enqueue_nd_range_kernel, queue, operation.kernel, operation.global_size,
                                 operation.local_size)
    if isinstance(operation, Copy):
        # pyopencl's enqueue_copy picks the call by its arguments' types in Python on each call
        # (~2.5 us more on PoCL's host): the buffer-to-buffer call itself (source first).
        return copy_buffer_call(queue, operation.source, operation.destination, operation.nbytes,
                                operation.source_offset, operation.destination_offset)
    if isinstance(operation, Flush):
        return queue.flush
    return functools.partial(operation, queue)


def _native_operation(operation: Launch | Copy | Fill | Flush) -> _Operation:
    record = _Operation()
    if isinstance(operation, Launch):
        dims = len(operation.global_size)
        if not 1 <= dims <= 3 or (operation.local_size is not None and len(operation.local_size) != dims):
            raise ValueError(f"a launch takes 1 to 3 dimensions and a local size of as many: "
                             f"{operation.global_size}, {operation.local_size}")
        record.kind, record.dims, record.kernel = LAUNCH, dims, operation.kernel.int_ptr
        record.global_size[:dims] = operation.global_size
        if operation.local_size is not None:
            record.local_size[:dims] = operation.local_size
    elif isinstance(operation, Copy):
        record.kind, record.source, record.destination = COPY, operation.source.int_ptr, operation.destination.int_ptr
        record.source_offset, record.destination_offset = operation.source_offset, operation.destination_offset
        record.nbytes = operation.nbytes
    elif isinstance(operation, Fill):
        record.kind, record.destination = FILL, operation.buffer.int_ptr
        record.destination_offset, record.nbytes = operation.offset, operation.nbytes
        record.pattern, record.pattern_size = ctypes.addressof(_PATTERNS[operation.pattern]), len(operation.pattern)
    else:
        record.kind = FLUSH
    return record


class LaunchList:
    """``operations`` enqueued on ``queue`` in order by each call.

    Invariant: the list holds every kernel, buffer and queue it was given for its lifetime (the C
    loop and the driver's recordings pass their raw handles), and a call enqueues exactly the
    operations given, in order, whichever way runs them. ``native``: use the C loop where it is
    available (see the module docstring); False always enqueues from Python. ``recording``: record
    each run of launches, copies and fills into the driver once and enqueue the recordings
    (:mod:`.driver_recording`; with the C loop only). Every kernel's arguments must be set before
    the list is made: a recording keeps them as they are then.
    """

    def __init__(self, queue: cl.CommandQueue, operations: Sequence[Operation], native: bool = True,
                 recording: DriverRecording | None = None) -> None:
        self.queue = queue
        self.operations = list(operations)
        #: One Python call per operation, in order (the Python loop; also what benchmarks time).
        self.calls = [_python_call(queue, operation) for operation in self.operations]
        self._native = native_loop() if native else None
        self._fell_back = native and self._native is None
        #: Per call of a step, in order: (first operation, what it is, function, arguments): a run
        #: of the C loop, a recording, or a Python operation.
        self._segments: list[tuple[int, str, Any, tuple[Any, ...]]] = []
        self._status = ctypes.c_int32(0)
        #: The driver's recordings of the runs (None: none), and why recording was refused ("" if not).
        self._recorded: RecordedRuns | None = None
        self.recording_refused = ""
        if self._native is None:
            return
        runs = self._runs()
        if recording is not None and recording.kind is not None:
            try:
                self._recorded = RecordedRuns(recording, queue)
                self._segments = self._recorded_segments(runs, self._recorded)
                return
            except RecordingRefused as refused:
                self._recorded = None
                what = "making or finishing a recording" if refused.index < 0 else self._describe(refused.index)
                self.recording_refused = (f"the driver refused to record {what} into a {recording.kind}: error "
                                          f"{refused.code} ({_error_name(refused.code)})")
                warnings.warn(f"torch_adreno: a replayed step is enqueued operation by operation: "
                              f"{self.recording_refused}", RuntimeWarning, stacklevel=2)
        self._segments = [self._loop_segment(run) if run else self._python_segment(first) for first, run in runs]

    def _runs(self) -> list[tuple[int, list[int]]]:
        """The list as the C loop takes it: each run of launches, copies, fills and flushes as
        (first index, the indices), and each Python operation between runs as (index, [])."""
        runs: list[tuple[int, list[int]]] = []
        run: list[int] = []
        for index, operation in enumerate([*self.operations, None]):
            if isinstance(operation, _NATIVE_KINDS):
                run.append(index)
                continue
            if run:
                runs.append((run[0], run))
                run = []
            if operation is not None:
                runs.append((index, []))
        return runs

    def _records(self, indices: list[int]) -> Any:
        return (_Operation * len(indices))(*(_native_operation(self.operations[i]) for i in indices))  # type: ignore[arg-type]

    def _loop_segment(self, indices: list[int]) -> tuple[int, str, Any, tuple[Any, ...]]:
        assert self._native is not None
        records = self._records(indices)
        # (The queue and entry points live as long as the list: self.queue, the cached loop.)
        return indices[0], _RUN, self._native.function, (self.queue.int_ptr, records, len(indices),
                                                         ctypes.byref(self._native.entry_points),
                                                         ctypes.byref(self._status))

    def _python_segment(self, index: int) -> tuple[int, str, Any, tuple[Any, ...]]:
        return index, _PYTHON, self.calls[index], ()

    def _recorded_segments(self, runs: list[tuple[int, list[int]]],
                           recorded: RecordedRuns) -> list[tuple[int, str, Any, tuple[Any, ...]]]:
        """The segments with each run recorded: a command buffer holds a run's launches, copies
        and fills (its flushes left out: the enqueue flushes after it); a recordable queue's
        recordings hold runs of at most ``max_launches`` launches, the copies, fills and flushes
        between them going to the C loop."""
        segments = []
        command_buffer = recorded.recording.kind == COMMAND_BUFFER
        for first, run in runs:
            if not run:
                segments.append(self._python_segment(first))
                continue
            groups: list[tuple[bool, list[int]]] = []  # (recorded, indices)
            for index in run:
                operation = self.operations[index]
                if command_buffer and isinstance(operation, Flush):
                    continue
                records = isinstance(operation, Launch) or (command_buffer and isinstance(operation, Copy | Fill))
                if (not groups or groups[-1][0] != records
                        or (records and not command_buffer and len(groups[-1][1]) == recorded.recording.max_launches)):
                    groups.append((records, []))
                groups[-1][1].append(index)
            for records, indices in groups:
                if not records:
                    segments.append(self._loop_segment(indices))
                    continue
                handle = recorded.record(self._records(indices), len(indices))
                call, arguments = recorded.call(handle)
                segments.append((indices[0], _RECORDED, call, arguments))
        return segments

    @property
    def native(self) -> bool:
        """Whether calls run the C loop (or the driver's recordings)."""
        return self._native is not None

    @property
    def recorded(self) -> str | None:
        """What the driver recorded the list into (:data:`~.driver_recording.COMMAND_BUFFER` or
        :data:`~.driver_recording.RECORDABLE_QUEUE`); None: it is enqueued operation by operation."""
        return self._recorded.recording.kind if self._recorded is not None else None

    @property
    def host_calls(self) -> int:
        """Calls a step makes to enqueue the list: recordings, C loop runs and Python operations."""
        return len(self._segments) if self._native is not None else len(self.calls)

    def describe(self) -> str:
        """How a call enqueues the list, e.g. ``command buffer (cl_khr_command_buffer 1.0.0): 1
        call per step for 497 operations``."""
        if self._recorded is not None:
            how = f"{self._recorded.recording.kind} ({self._recorded.recording.detail})"
        elif self._native is not None:
            how = "C loop" + (f" ({self.recording_refused})" if self.recording_refused else "")
        else:
            how = "Python loop" + (f" ({native_loop_status()})" if self._fell_back else "")
        calls = self.host_calls
        return f"{how}: {calls} call{'s' if calls != 1 else ''} per step for {len(self.operations)} operations"

    def __call__(self) -> None:
        if self._native is None:
            if self._fell_back:
                _warn_python_loop(native_loop_status())
            index = 0
            try:
                for index, call in enumerate(self.calls):  # noqa: B007 (read by the handler)
                    call()
            except cl.Error as error:
                raise self._refused(index, error.code) from None
            return
        for first, kind, call, arguments in self._segments:
            result = call(*arguments)
            if kind is _RUN:
                if result >= 0:
                    raise self._refused(first + result, self._status.value)
            elif kind is _RECORDED and result != 0:
                raise LaunchError(f"the OpenCL driver refused to enqueue the {self.recorded} holding operations "
                                  f"from {first} ({self._describe(first)}) of a launch list: error {result} "
                                  f"({_error_name(result)})")

    def _describe(self, index: int) -> str:
        operation = self.operations[index]
        return (operation.describe() if isinstance(operation, Launch) else type(operation).__name__.lower()
                if isinstance(operation, Copy | Fill | Flush) else "a Python operation")

    def _refused(self, index: int, code: int) -> LaunchError:
        """The error for operation ``index``, refused by the driver with error ``code``."""
        return LaunchError(f"the OpenCL driver refused operation {index} of a launch list ({self._describe(index)}): "
                           f"error {code} ({_error_name(code)})")


def _error_name(code: int) -> str:
    names = {value: name for name, value in vars(cl.status_code).items() if isinstance(value, int)}
    return names.get(code, "unknown")
