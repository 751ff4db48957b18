"""A fixed list of device operations on one queue, enqueued in order with as little host work as
the driver allows.

A replayed step (:mod:`torch_adreno.replay.step`) is such a list: launches of kernels whose
arguments are bound once, buffer copies, buffer fills (``fill_uninitialized_memory``) and flushes. Enqueued from Python, each costs ~1-2 us of
interpreter and pyopencl work (argument conversion, an event object per call) on top of the
driver's own enqueue. So runs of them go to a small C loop (``launch_list.c``) in one ctypes call,
which calls the driver's entry points directly and asks for no events. Operations it does not know
(an image refresh) stay Python callables between the runs.

The C loop is built once per machine with its C compiler (``$TORCH_ADRENO_CC``, else ``$CC``,
else ``cc``, ``gcc`` or ``clang``) into the cache directory, as PoCL or Inductor build code at run
time; it needs no headers and links nothing. Where it cannot be built or loaded, the same
operations are enqueued from Python, in the same order (bit-identical results), and
:func:`native_loop_status` says why; a warning says so once, the first time a list is enqueued
that way. ``TORCH_ADRENO_NATIVE_LOOP=0`` chooses the Python loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyopencl as cl

from torch_adreno.config import cache_root
from torch_adreno.runner.format import FILL_PATTERN, fill_commands
from torch_adreno.runtime.enqueue import copy_buffer_call, fill_buffer_call

__all__ = ["Copy", "Fill", "Flush", "Launch", "LaunchError", "LaunchList", "native_loop", "native_loop_status"]

SOURCE = Path(__file__).with_name("launch_list.c")
ENV_COMPILER = "TORCH_ADRENO_CC"
ENV_SWITCH = "TORCH_ADRENO_NATIVE_LOOP"

# The operation kinds of launch_list.c.
_LAUNCH, _COPY, _FLUSH, _FILL = 0, 1, 2, 3
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


class _Operation(ctypes.Structure):
    """``struct ta_operation`` of launch_list.c."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("dims", ctypes.c_uint32),
        ("kernel", ctypes.c_void_p),
        ("source", ctypes.c_void_p),
        ("destination", ctypes.c_void_p),
        ("global_size", ctypes.c_size_t * 3),
        ("local_size", ctypes.c_size_t * 3),
        ("source_offset", ctypes.c_size_t),
        ("destination_offset", ctypes.c_size_t),
        ("nbytes", ctypes.c_size_t),
        ("pattern", ctypes.c_void_p),
        ("pattern_size", ctypes.c_size_t),
    ]


class _EntryPoints(ctypes.Structure):
    """``struct ta_entry_points`` of launch_list.c."""

    _fields_ = [("enqueue_nd_range_kernel", ctypes.c_void_p), ("enqueue_copy_buffer", ctypes.c_void_p),
                ("flush", ctypes.c_void_p), ("enqueue_fill_buffer", ctypes.c_void_p)]


@dataclass(frozen=True)
class NativeLoop:
    """The built C loop and the OpenCL entry points it calls."""

    function: Any
    entry_points: _EntryPoints
    library: Path
    opencl: str


def _compiler(environ: dict[str, str] | os._Environ[str]) -> str | None:
    for name in (environ.get(ENV_COMPILER), environ.get("CC")):
        if name:
            return name
    return next((found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)


def _opencl_library() -> str | None:
    """The path of the OpenCL library this process loaded for pyopencl (its handles are that
    library's): found in the process's memory map (pyopencl's extension, imported above, loaded
    it); else the system's."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if path.startswith("/") and os.path.basename(path).startswith("libOpenCL"):
                    return path
    except OSError:
        pass
    return ctypes.util.find_library("OpenCL")


def _build(compiler: str) -> Path:
    """The C loop's shared library, built into the cache directory unless there already."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + compiler.encode() + platform.machine().encode()).hexdigest()[:16]
    directory = cache_root() / "native"
    library = directory / f"launch_list-{key}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        built = Path(scratch) / library.name
        result = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(built), str(SOURCE)],
                                capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise OSError(f"{compiler} failed: {result.stderr.strip()[:500]}")
        os.replace(built, library)  # atomic: a concurrent process finds a whole library or none
    return library


@functools.cache
def _load() -> tuple[NativeLoop | None, str]:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None, f"off ({ENV_SWITCH}=0)"
    compiler = _compiler(os.environ)
    if compiler is None:
        return None, f"no C compiler found (set {ENV_COMPILER} or CC, or install cc)"
    opencl = _opencl_library()
    if opencl is None:
        return None, "the OpenCL library pyopencl uses was not found"
    try:
        library = _build(compiler)
        loop = ctypes.CDLL(str(library))
        driver = ctypes.CDLL(opencl)
        entry_points = _EntryPoints(*(ctypes.cast(getattr(driver, name), ctypes.c_void_p).value for name in
                                      ("clEnqueueNDRangeKernel", "clEnqueueCopyBuffer", "clFlush",
                                       "clEnqueueFillBuffer")))
    except (OSError, AttributeError, subprocess.SubprocessError) as error:
        return None, f"the C loop could not be built or loaded: {error}"
    function = loop.ta_enqueue_operations
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                         ctypes.POINTER(ctypes.c_int32)]
    return NativeLoop(function, entry_points, library, opencl), f"native ({library.name}, {opencl})"


def native_loop() -> NativeLoop | None:
    """The C loop, built and loaded once per process; None where it cannot be (see
    :func:`native_loop_status`)."""
    return _load()[0]


def native_loop_status() -> str:
    """How launch lists are enqueued in this process: ``native (...)`` or why not."""
    return _load()[1]


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
        record.kind, record.dims, record.kernel = _LAUNCH, dims, operation.kernel.int_ptr
        record.global_size[:dims] = operation.global_size
        if operation.local_size is not None:
            record.local_size[:dims] = operation.local_size
    elif isinstance(operation, Copy):
        record.kind, record.source, record.destination = _COPY, operation.source.int_ptr, operation.destination.int_ptr
        record.source_offset, record.destination_offset = operation.source_offset, operation.destination_offset
        record.nbytes = operation.nbytes
    elif isinstance(operation, Fill):
        record.kind, record.destination = _FILL, operation.buffer.int_ptr
        record.destination_offset, record.nbytes = operation.offset, operation.nbytes
        record.pattern, record.pattern_size = ctypes.addressof(_PATTERNS[operation.pattern]), len(operation.pattern)
    else:
        record.kind = _FLUSH
    return record


class LaunchList:
    """``operations`` enqueued on ``queue`` in order by each call.

    Invariant: the list holds every kernel, buffer and queue it was given for its lifetime (the C
    loop passes their raw handles), and a call enqueues exactly the operations given, in order,
    whichever loop runs them. ``native``: use the C loop where it is available (see the module
    docstring); False always enqueues from Python.
    """

    def __init__(self, queue: cl.CommandQueue, operations: Sequence[Operation], native: bool = True) -> None:
        self.queue = queue
        self.operations = list(operations)
        #: One Python call per operation, in order (the Python loop; also what benchmarks time).
        self.calls = [_python_call(queue, operation) for operation in self.operations]
        self._native = native_loop() if native else None
        self._fell_back = native and self._native is None
        #: The list as the C loop runs it: per run of launches, copies, fills and flushes, (first index,
        #: C array, length); a Python operation between runs as (index, None, 0).
        self._segments: list[tuple[int, Any, int]] = []
        self._status = ctypes.c_int32(0)
        if self._native is not None:
            # What every C call passes, converted once (the queue and entry points live as long
            # as the list: self.queue, the cached loop).
            self._call_arguments = (queue.int_ptr, ctypes.byref(self._native.entry_points),
                                    ctypes.byref(self._status))
            run: list[int] = []
            for index, operation in enumerate([*self.operations, None]):
                if isinstance(operation, _NATIVE_KINDS):
                    run.append(index)
                    continue
                if run:
                    records = (_Operation * len(run))(*(_native_operation(self.operations[i]) for i in run))  # type: ignore[arg-type]
                    self._segments.append((run[0], records, len(run)))
                    run = []
                if operation is not None:
                    self._segments.append((index, None, 0))

    @property
    def native(self) -> bool:
        """Whether calls run the C loop."""
        return self._native is not None

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
        function = self._native.function
        queue, entry_points, status = self._call_arguments
        for first, records, count in self._segments:
            if records is None:
                self.calls[first]()
                continue
            failed = function(queue, records, count, entry_points, status)
            if failed >= 0:
                raise self._refused(first + failed, self._status.value)

    def _refused(self, index: int, code: int) -> LaunchError:
        """The error for operation ``index``, refused by the driver with error ``code``."""
        operation = self.operations[index]
        what = (operation.describe() if isinstance(operation, Launch) else type(operation).__name__.lower()
                if isinstance(operation, Copy | Fill | Flush) else "a Python operation")
        return LaunchError(f"the OpenCL driver refused operation {index} of a launch list ({what}): "
                           f"error {code} ({_error_name(code)})")


def _error_name(code: int) -> str:
    names = {value: name for name, value in vars(cl.status_code).items() if isinstance(value, int)}
    return names.get(code, "unknown")
