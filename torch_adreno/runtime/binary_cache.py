"""Built OpenCL programs, cached as device binaries on disk so that a second process compiles
nothing it compiled before.

Lookup order for a program: this process's programs, then the disk cache, then the compiler.

* **Key**: sha256 over the program source, its build options, the device (name, vendor, OpenCL
  version), the driver version, the platform (name, version) and :data:`CACHE_FORMAT`. Anything
  that can change the binary a driver produces is in the key, so an entry is never used for a
  different program or driver; entries of an older driver are left behind, never misused.
* **Directory**: ``$TORCH_ADRENO_CACHE_DIR`` if set, else ``programs/`` under
  :func:`torch_adreno.config.cache_root` (``~/.cache/torch_adreno`` unless ``$TORCH_ADRENO_CACHE``).
* **On or off**: ``TORCH_ADRENO_BINARY_CACHE`` = ``1`` (on), ``0`` (off: every process compiles
  everything) or ``auto`` (the default): on, except on PoCL. PoCL caches source builds itself (in
  ``POCL_CACHE_DIR``; a repeated build costs a fraction of a cold one), and fetching a program's
  binary makes it compile every kernel once more, for any work-group size: on the reference
  models seconds to tens of seconds more per cold compile, for a fraction of a second saved per
  warm one. Other drivers get the cache: most do not cache source builds, and where
  the build's product is the device binary, fetching it is a copy.
* **File**: ``<key>.bin`` holding :data:`MAGIC`, the sha256 of the binary, then the binary. The
  checksum is verified before the driver sees a byte: drivers do not all reject a damaged binary
  cleanly (PoCL 3.0 crashes the process on a truncated one). It also catches a write torn by a
  crash, so entries are not fsync'ed.
* **Never fatal**: an entry that fails its checksum, that the driver rejects, or whose program lacks
  a kernel it should have is deleted and the program is built from source. A cache directory that
  cannot be written only costs the next process a compile (counted in :class:`BuildStats`).
* **Concurrency**: an entry is written to a temporary file in the same directory and renamed over
  ``<key>.bin`` (atomic on POSIX and Windows), so a reader sees a whole entry or none. Two
  processes that miss the same key both compile and the last rename wins; both entries are valid.

PyOpenCL's own source cache is bypassed (``cache_dir=False``): this cache replaces it, and a cold
build must really compile. Drivers may still keep caches of their own (PoCL's kernel cache,
``POCL_CACHE_DIR``; NVIDIA's compute cache, ``CUDA_CACHE_PATH``) that this module does not control.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import cast

import pyopencl as cl

from torch_adreno.config import cache_root
from torch_adreno.errors import OptionError

ENV_DIR = "TORCH_ADRENO_CACHE_DIR"
ENV_ENABLE = "TORCH_ADRENO_BINARY_CACHE"
#: Bump when the file layout or the key's fields change: older entries then simply stop matching.
CACHE_FORMAT = 1
MAGIC = b"TADRPB01"
_DIGEST = 32


@dataclass
class BuildStats:
    """Counts and seconds of program builds in this process since the last :func:`reset_build_stats`.

    ``source_seconds`` is time building from source; ``load_seconds`` reading entries and building
    from their binaries (rejected entries included); ``store_seconds`` fetching binaries from the
    driver and writing entries (on PoCL, fetching a binary compiles every kernel of the program to
    machine code, the largest part of a cold build). Their sum is the process's OpenCL build time.
    """

    programs_from_source: int = 0
    programs_from_cache: int = 0
    #: Programs this process had built already (same source, options and context): no work at all.
    programs_reused: int = 0
    #: Entries deleted because their checksum failed, the driver rejected them or a kernel was missing.
    entries_rejected: int = 0
    #: Entries that could not be written (read-only or full disk); the program itself is fine.
    write_failures: int = 0
    #: Kernel objects asked for (:func:`torch_adreno.runtime.build.build_kernels`), and the distinct
    #: kernels among them, each a function of its program (kernels of equal content share one).
    kernels_requested: int = 0
    kernels_unique: int = 0
    #: Functions of the programs built from source (the kernels the compiler compiled).
    kernels_from_source: int = 0
    source_seconds: float = 0.0
    load_seconds: float = 0.0
    store_seconds: float = 0.0

    @property
    def build_seconds(self) -> float:
        return self.source_seconds + self.load_seconds + self.store_seconds


STATS = BuildStats()
_lock = threading.Lock()
# Keyed by (id(context), device, program key); the context is kept in the value so that its id
# cannot be reused by another context while the entry exists.
_programs: dict[tuple[int, int, str], tuple[cl.Context, cl.Program]] = {}


def build_stats() -> BuildStats:
    """A snapshot of :data:`STATS` (later builds do not change it)."""
    with _lock:
        return replace(STATS)


def reset_build_stats() -> None:
    with _lock:
        for name, value in vars(BuildStats()).items():
            setattr(STATS, name, value)


def count_kernels(requested: int, unique: int) -> None:
    """Count a build of ``requested`` kernel objects made from ``unique`` program functions."""
    with _lock:
        STATS.kernels_requested += requested
        STATS.kernels_unique += unique


def forget_programs() -> None:
    """Drop this process's built programs (the disk cache stays), so that the next lookup goes to the
    disk as a fresh process would. Kernel objects already made from them keep working."""
    with _lock:
        _programs.clear()


_MODES = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
          "off": False, "auto": None, "": None}
# Drivers that cache source builds themselves and compile again to hand out a binary (see above).
_SELF_CACHING_PLATFORMS = ("Portable Computing Language",)


def cache_enabled(device: cl.Device, environ: Mapping[str, str] | None = None) -> bool:
    """Whether programs for ``device`` go through the disk cache (``TORCH_ADRENO_BINARY_CACHE``:
    1/0, true/false, yes/no, on/off or auto, any case; unset means auto)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_ENABLE, "")
    if raw.strip().lower() not in _MODES:
        raise OptionError(f"environment variable {ENV_ENABLE}: must be 1, 0 or auto, got {raw!r}")
    mode = _MODES[raw.strip().lower()]
    return mode if mode is not None else device.platform.name.strip() not in _SELF_CACHING_PLATFORMS


def cache_directory(environ: Mapping[str, str] | None = None) -> Path:
    """Where entries live (read from the environment on every call; may not exist yet)."""
    environ = os.environ if environ is None else environ
    override = environ.get(ENV_DIR, "")
    return Path(override) if override else cache_root(environ) / "programs"


@cache
def device_identity(device: cl.Device) -> str:
    """The device, its vendor and driver versions and its platform, as one JSON string."""
    platform = device.platform
    return json.dumps({
        "device": device.name.strip(), "vendor": device.vendor.strip(), "device_version": device.version.strip(),
        "driver": device.driver_version.strip(), "platform": platform.name.strip(),
        "platform_version": platform.version.strip(),
    }, sort_keys=True)


def program_key(source: str, options: Sequence[str], device: cl.Device) -> str:
    """The hex sha256 naming a program's entry; equal only for equal source, options, device, driver."""
    text = json.dumps([CACHE_FORMAT, device_identity(device), list(options), source])
    return hashlib.sha256(text.encode()).hexdigest()


def _entry_path(key: str) -> Path:
    return cache_directory() / f"{key}.bin"


def _read_entry(path: Path) -> bytes | None:
    """The binary of an intact entry; None when there is none. A damaged entry raises ValueError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"unreadable: {err}") from None
    header = len(MAGIC) + _DIGEST
    if len(data) <= header or not data.startswith(MAGIC):
        raise ValueError("not a program binary entry of this format")
    binary = data[header:]
    if hashlib.sha256(binary).digest() != data[len(MAGIC):header]:
        raise ValueError("checksum mismatch")
    return binary


def _write_entry(path: Path, binary: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + hashlib.sha256(binary).digest() + binary)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _discard(path: Path) -> None:
    # Failing to delete is harmless: the entry is checked again, and rejected again, when next read.
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _has_kernels(program: cl.Program, kernel_names: Sequence[str]) -> bool:
    if not kernel_names:
        return True
    names = set(str(program.get_info(cl.program_info.KERNEL_NAMES)).split(";"))
    return set(kernel_names) <= names


def _load(context: cl.Context, device: cl.Device, path: Path, options: Sequence[str],
          kernel_names: Sequence[str]) -> cl.Program | None:
    """The program built from the entry at ``path``; None when there is no entry, or when it is
    unusable (it is then deleted and counted)."""
    try:
        binary = _read_entry(path)
        if binary is None:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            program = cl.Program(context, [device], [binary]).build(options=list(options), devices=[device])
        if _has_kernels(program, kernel_names):
            return program
    except (ValueError, cl.Error):
        pass  # damaged, or a driver that no longer accepts the binary: compile from source instead
    _discard(path)
    STATS.entries_rejected += 1
    return None


def _binary_of(program: cl.Program, device: cl.Device) -> bytes:
    devices = cast("list[cl.Device]", program.get_info(cl.program_info.DEVICES))
    binaries = cast("list[bytes]", program.get_info(cl.program_info.BINARIES))
    return bytes(binaries[devices.index(device)])


def get_program(context: cl.Context, device: cl.Device, source: str, options: Sequence[str],
                kernel_names: Sequence[str] = ()) -> cl.Program:
    """The program of ``source`` built with ``options`` for ``device`` (the only device it is built
    for), from this process, the disk cache, or the compiler, in that order. ``kernel_names``, when
    given, must all be in a cached program for it to be used (and are what ``BuildStats`` counts
    as the kernels compiled).

    Compile errors propagate as :class:`pyopencl.RuntimeError` and a bad ``TORCH_ADRENO_BINARY_CACHE``
    value as :class:`OptionError`; trouble with the cache itself never raises.
    """
    key = program_key(source, options, device)
    memo = (id(context), device.int_ptr, key)
    with _lock:
        known = _programs.get(memo)
        if known is not None:
            STATS.programs_reused += 1
            return known[1]
        use_disk = cache_enabled(device)
        path = _entry_path(key)
        program = None
        if use_disk:
            start = time.perf_counter()
            program = _load(context, device, path, options, kernel_names)
            STATS.load_seconds += time.perf_counter() - start
            if program is not None:
                STATS.programs_from_cache += 1
        if program is None:
            start = time.perf_counter()
            # cache_dir=False: PyOpenCL's source cache would make a "cold" build a disk read. A build
            # that succeeds needs no log (Intel's CPU runtime writes one for every program); a
            # failure raises with it.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", cl.CompilerWarning)
                program = cl.Program(context, source).build(
                    options=list(options), devices=[device], cache_dir=False)  # type: ignore[arg-type]
            STATS.source_seconds += time.perf_counter() - start
            STATS.programs_from_source += 1
            STATS.kernels_from_source += len(kernel_names)
            if use_disk:
                start = time.perf_counter()
                try:
                    binary = _binary_of(program, device)
                    if binary:  # a driver may not return binaries; then there is nothing to cache
                        _write_entry(path, binary)
                except (OSError, cl.Error):
                    STATS.write_failures += 1
                STATS.store_seconds += time.perf_counter() - start
        _programs[memo] = (context, program)
        return program
