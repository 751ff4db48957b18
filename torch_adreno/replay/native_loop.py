"""The C loop of launch lists (``launch_list.c``), built once per machine and loaded through ctypes.

It is built with the machine's C compiler (``$TORCH_ADRENO_CC``, else ``$CC``, else ``cc``,
``gcc`` or ``clang``) into the cache directory, as PoCL or Inductor build code at run time; it needs
no headers and links nothing. The OpenCL entry points it calls come from the OpenCL library this
process loaded for pyopencl (its handles are that library's). Where it cannot be built or loaded,
:func:`native_loop` is None and :func:`native_loop_status` says why; ``TORCH_ADRENO_NATIVE_LOOP=0``
turns it off.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_adreno.config import cache_root

__all__ = ["NativeLoop", "native_loop", "native_loop_status"]

SOURCE = Path(__file__).with_name("launch_list.c")
ENV_COMPILER = "TORCH_ADRENO_CC"
ENV_SWITCH = "TORCH_ADRENO_NATIVE_LOOP"

# The operation kinds of launch_list.c.
LAUNCH, COPY, FLUSH, FILL = 0, 1, 2, 3


class Operation(ctypes.Structure):
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


class EntryPoints(ctypes.Structure):
    """``struct ta_entry_points`` of launch_list.c."""

    _fields_ = [("enqueue_nd_range_kernel", ctypes.c_void_p), ("enqueue_copy_buffer", ctypes.c_void_p),
                ("flush", ctypes.c_void_p), ("enqueue_fill_buffer", ctypes.c_void_p)]


@dataclass(frozen=True)
class NativeLoop:
    """The built C loop and the OpenCL entry points it calls; ``loaded`` and ``driver``: the C loop's
    and the OpenCL library's ctypes handles (driver recording, :mod:`.driver_recording`, calls
    both)."""

    function: Any
    entry_points: EntryPoints
    library: Path
    opencl: str
    loaded: Any
    driver: Any


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
        entry_points = EntryPoints(*(ctypes.cast(getattr(driver, name), ctypes.c_void_p).value for name in
                                      ("clEnqueueNDRangeKernel", "clEnqueueCopyBuffer", "clFlush",
                                       "clEnqueueFillBuffer")))
    except (OSError, AttributeError, subprocess.SubprocessError) as error:
        return None, f"the C loop could not be built or loaded: {error}"
    function = loop.ta_enqueue_operations
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                         ctypes.POINTER(ctypes.c_int32)]
    return NativeLoop(function, entry_points, library, opencl, loop, driver), f"native ({library.name}, {opencl})"


def native_loop() -> NativeLoop | None:
    """The C loop, built and loaded once per process; None where it cannot be (see
    :func:`native_loop_status`)."""
    return _load()[0]


def native_loop_status() -> str:
    """How launch lists are enqueued in this process: ``native (...)`` or why not."""
    return _load()[1]
