"""OpenCL drivers installed from pip, made visible to the ICD loader before pyopencl loads it.

pyopencl's wheel bundles an ICD loader and PoCL 3.0 (LLVM 14), whose compiler refuses CPUs LLVM 14
does not know (AMD Zen 5: "unknown target CPU 'generic'"), so on such a machine pip gives no device
that can build a kernel. Intel's OpenCL CPU runtime from pip (``intel-opencl-rt``) runs on AMD and
Intel x86-64 CPUs alike, and has ``cl_khr_fp16``; but its wheel's ``etc/OpenCL/vendors/*.icd``
names a placeholder path, so the loader never finds it. :func:`register_pip_drivers` writes a
vendors directory of our own (the system's ``/etc/OpenCL/vendors`` entries, so that installed GPU
drivers stay visible, plus the pip runtime's library by its real path) and points
``OCL_ICD_VENDORS`` at it. It runs when ``torch_adreno`` is imported, before anything imports
pyopencl, and never overrides an ``OCL_ICD_VENDORS`` or ``OCL_ICD_FILENAMES`` the user set.

This module imports neither torch nor pyopencl.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import MutableMapping
from pathlib import Path

#: pip distribution -> the ICD library file it installs.
PIP_DRIVERS = {"intel-opencl-rt": "libintelocl.so"}
SYSTEM_VENDORS = Path("/etc/OpenCL/vendors")
#: The loader's variables a user may set; if either is, the user's choice stands.
USER_VARIABLES = ("OCL_ICD_VENDORS", "OCL_ICD_FILENAMES")


def pip_driver_libraries() -> dict[str, Path]:
    """The ICD libraries of the pip-installed OpenCL drivers found, by distribution name."""
    found: dict[str, Path] = {}
    for distribution, library in PIP_DRIVERS.items():
        try:
            files = importlib.metadata.distribution(distribution).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for file in files:
            if file.name == library:
                path = Path(str(file.locate())).resolve()
                if path.is_file():
                    found[distribution] = path
                    break
    return found


def load_failures(libraries: dict[str, Path] | None = None) -> dict[str, str]:
    """Per pip driver whose library the dynamic linker cannot load, its error: the ICD loader
    skips such a driver without a word (a missing sibling library, say), so ``devices`` says it."""
    import ctypes

    failures = {}
    for distribution, library in (pip_driver_libraries() if libraries is None else libraries).items():
        try:
            ctypes.CDLL(str(library))
        except OSError as error:
            failures[distribution] = str(error)
    return failures


def _cache_dir(environ: MutableMapping[str, str]) -> Path:
    root = environ.get("TORCH_ADRENO_CACHE")
    return Path(root) if root else Path(environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch_adreno"


def vendor_entries(libraries: dict[str, Path], system: Path = SYSTEM_VENDORS) -> dict[str, str]:
    """The ``.icd`` files of the vendors directory: the system's own, then one per pip driver
    (skipped where a system entry already names the same library)."""
    entries: dict[str, str] = {}
    if system.is_dir():
        for icd in sorted(system.glob("*.icd")):
            try:
                entries[icd.name] = icd.read_text()
            except OSError:
                continue
    named = {Path(text.strip()).resolve() for text in entries.values() if text.strip().startswith("/")}
    for distribution, library in libraries.items():
        if library not in named:
            entries[f"torch-adreno-{distribution}.icd"] = f"{library}\n"
    return entries


def register_pip_drivers(environ: MutableMapping[str, str] | None = None,
                         system: Path = SYSTEM_VENDORS) -> Path | None:
    """Point the ICD loader at a vendors directory that includes the pip-installed drivers (see the
    module docstring). Returns that directory, or None when nothing was changed: no pip driver is
    installed, or the user set one of :data:`USER_VARIABLES`, or the directory cannot be written."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in USER_VARIABLES):
        return None
    libraries = pip_driver_libraries()
    if not libraries:
        return None
    directory = _cache_dir(environ) / "opencl-vendors"
    entries = vendor_entries(libraries, system)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.icd"):
            if stale.name not in entries:
                stale.unlink()
        for name, text in entries.items():
            path = directory / name
            if not path.is_file() or path.read_text() != text:
                partial = path.with_suffix(f".{os.getpid()}.tmp")
                partial.write_text(text)
                partial.replace(path)  # atomic: a concurrent process sees the old or the new file
    except OSError:
        return None
    environ["OCL_ICD_VENDORS"] = str(directory)
    return directory


__all__ = ["PIP_DRIVERS", "load_failures", "pip_driver_libraries", "register_pip_drivers", "vendor_entries"]
