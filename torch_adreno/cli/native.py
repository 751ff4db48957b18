"""``native``: build the native step runtime (``native/``: ``torch-adreno-step`` and
``libtorch_adreno_step``) with CMake, and the environment that runs it on pip's OpenCL drivers.

    python -m torch_adreno native build                          # this machine
    python -m torch_adreno native build --target linux-aarch64   # 64-bit ARM Linux (glibc), through zig
    python -m torch_adreno native build --target android-arm64 --ndk $ANDROID_NDK_HOME
    eval "$(python -m torch_adreno native env)"                  # torch-adreno-step on PATH, with pip's drivers

The compiler: the machine's ``cc`` for the host, or zig's clang (the ``ziglang`` pip package) where
there is none and for ``linux-aarch64``; the NDK's toolchain file for Android (bionic, which zig
does not provide). Builds go to ``build/native/<target>`` of the checkout unless ``--build-dir``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "native"
TARGETS = ("host", "linux-aarch64", "android-arm64")
#: zig's target for linux-aarch64: glibc 2.28 (2018) and later, dynamically linked so that dlopen works.
ZIG_AARCH64 = "aarch64-linux-gnu.2.28"


class NativeBuildError(RuntimeError):
    """The native runtime could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class NativeBuild:
    build_dir: Path
    executable: Path
    library: Path
    fuzz_driver: Path | None
    #: examples/api_tour.c: the C API through the shared library and its header only
    api_tour: Path


def _zig_wrappers(build_dir: Path, target: str | None) -> dict[str, str]:
    """CMake cache entries that make zig's clang (and its ar, ranlib) the toolchain. CMake takes a
    compiler as one program, so each is a small script calling ``python -m ziglang``."""
    try:
        import ziglang  # noqa: F401
    except ImportError:
        raise NativeBuildError("no C compiler: install zig's (pip install ziglang) or a system one (gcc, clang)") from None
    build_dir.mkdir(parents=True, exist_ok=True)
    tools = {}
    for tool, words in (("cc", ["cc", *(["-target", target] if target else [])]), ("ar", ["ar"]), ("ranlib", ["ranlib"])):
        script = build_dir / f"zig-{tool}"
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ziglang {" ".join(words)} "$@"\n')
        script.chmod(0o755)
        tools[tool] = str(script)
    return {"CMAKE_C_COMPILER": tools["cc"], "CMAKE_AR": tools["ar"], "CMAKE_RANLIB": tools["ranlib"]}


def _configuration(target: str, build_dir: Path, ndk: Path | None) -> dict[str, str]:
    if target == "host":
        return {} if shutil.which("cc") or shutil.which("gcc") or shutil.which("clang") else _zig_wrappers(build_dir, None)
    if target == "linux-aarch64":
        # (-s: zig's clang keeps debug information even in a release build)
        return {**_zig_wrappers(build_dir, ZIG_AARCH64), "CMAKE_SYSTEM_NAME": "Linux", "CMAKE_SYSTEM_PROCESSOR": "aarch64",
                "CMAKE_EXE_LINKER_FLAGS": "-s", "CMAKE_SHARED_LINKER_FLAGS": "-s", "TAS_BUILD_FUZZ": "OFF"}
    if ndk is None:
        raise NativeBuildError("--target android-arm64 needs --ndk DIR (the Android NDK: its toolchain file and bionic "
                               "libc; zig does not provide Android's libc)")
    toolchain = ndk / "build" / "cmake" / "android.toolchain.cmake"
    if not toolchain.is_file():
        raise NativeBuildError(f"{ndk} is not an Android NDK: it has no {toolchain.relative_to(ndk)}")
    return {"CMAKE_TOOLCHAIN_FILE": str(toolchain), "ANDROID_ABI": "arm64-v8a", "ANDROID_PLATFORM": "android-26",
            "TAS_BUILD_FUZZ": "OFF"}


def _run_showing_progress(command: list[str], progress: Callable[[str], None] | None) -> None:
    """Run a CMake step, passing its progress lines (``[ 42%] Building C object ...``) to
    ``progress`` as they come; the whole output goes into the error when it fails."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if progress is not None and line.startswith("[") and "]" in line[:12]:
            progress(line.rstrip())
    if process.wait() != 0:
        raise NativeBuildError(f"{' '.join(command[:2])} ... failed:\n{''.join(lines)[-4000:]}")


def build_native(target: str = "host", build_dir: Path | None = None, ndk: Path | None = None,
                 sanitize: bool = False, build_type: str = "Release", jobs: int = 2,
                 progress: Callable[[str], None] | None = None) -> NativeBuild:
    """Configure and build ``native/`` for ``target``; returns the paths of what was built.
    ``progress``: called with a line per stage and per file compiled (the command prints them)."""
    if target not in TARGETS:
        raise NativeBuildError(f"unknown target {target!r}; targets: {', '.join(TARGETS)}")
    if not (SOURCE / "CMakeLists.txt").is_file():
        raise NativeBuildError(f"the native sources are not at {SOURCE}: build from a checkout of torch_adreno "
                               "(pip install -e .)")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise NativeBuildError("cmake is not installed: pip install cmake (or the system's package)")
    build_dir = build_dir or default_build_dir(target, sanitize)
    entries = {"CMAKE_BUILD_TYPE": build_type, "TAS_SANITIZE": "ON" if sanitize else "OFF",
               **_configuration(target, build_dir, ndk)}
    configure = [cmake, "-S", str(SOURCE), "-B", str(build_dir), *(f"-D{k}={v}" for k, v in entries.items())]
    for stage, command in (("configuring", configure),
                           ("compiling", [cmake, "--build", str(build_dir), "--parallel", str(jobs)])):
        if progress is not None:
            progress(f"{stage} ({target}, {build_dir})")
        _run_showing_progress(command, progress)
    fuzz = build_dir / "fuzz-readers"
    return NativeBuild(build_dir, build_dir / "torch-adreno-step", build_dir / "libtorch_adreno_step.so",
                       fuzz if fuzz.is_file() else None, build_dir / "api-tour")


def default_build_dir(target: str = "host", sanitize: bool = False) -> Path:
    return SOURCE.parent / "build" / "native" / (target + ("-sanitize" if sanitize else ""))


def opencl_environment(root: Path | None = None) -> dict[str, str]:
    """Variables that let the native runtime load an OpenCL ICD loader with pip's drivers (PoCL from
    pyopencl's wheel, Intel's CPU runtime): pyopencl's bundled loader, a vendors folder naming the
    other drivers by their absolute paths, and ``PYOPENCL_HOME``, a folder whose ``.libs/pocl.icd``
    names pyopencl's PoCL by its absolute path (pyopencl's own names a relative one, found only
    inside a process that has loaded pyopencl). Empty where pip brought no loader.

    PoCL is listed there and not in the vendors folder: pyopencl's loader (ocl-icd, patched to also
    read ``$PYOPENCL_HOME/.libs``) reads both, and pyopencl sets ``PYOPENCL_HOME`` to its own
    folder when imported; so a Python process in this environment finds PoCL once, through its
    own ``pocl.icd``, and a native process once, through ours."""
    import importlib.util

    from torch_adreno.opencl_drivers import SYSTEM_VENDORS, _cache_dir, pip_driver_libraries, vendor_entries

    spec = importlib.util.find_spec("pyopencl")
    if spec is None or spec.origin is None:
        return {}
    libs = Path(spec.origin).parent / ".libs"
    loaders = sorted(libs.glob("libOpenCL*.so*"))
    if not loaders:
        return {}
    root = root or _cache_dir(os.environ) / "native-opencl"
    vendors, home = root / "vendors", root / "pyopencl-home"
    _write_icd_folder(vendors, vendor_entries(pip_driver_libraries(), SYSTEM_VENDORS))
    _write_icd_folder(home / ".libs", {icd.name: f"{libs / icd.read_text().strip()}\n" for icd in libs.glob("*.icd")})
    return {"TORCH_ADRENO_OPENCL_LIBRARY": str(loaders[0]), "OCL_ICD_VENDORS": str(vendors), "PYOPENCL_HOME": str(home)}


def _write_icd_folder(folder: Path, entries: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.icd"):
        if stale.name not in entries:
            stale.unlink()
    for name, text in entries.items():
        (folder / name).write_text(text)


def _python() -> str:
    """How to name this Python in a line the user pastes: ``python`` where that is this one."""
    found = shutil.which("python")
    return "python" if found and Path(found).resolve() == Path(sys.executable).resolve() else sys.executable


def register(sub: argparse._SubParsersAction) -> None:
    native = sub.add_parser("native", help="build the native step runtime (torch-adreno-step, a C API for apps)")
    actions = native.add_subparsers(dest="action", required=True, metavar="<action>")
    build = actions.add_parser("build", help="build native/ with CMake and print the paths of what was built")
    build.add_argument("--target", choices=TARGETS, default="host", help="what to build for (default: %(default)s)")
    build.add_argument("--ndk", type=Path, default=None, help="the Android NDK (--target android-arm64)")
    build.add_argument("--build-dir", type=Path, default=None, help="default: build/native/<target> of the checkout")
    build.add_argument("--sanitize", action="store_true", help="with AddressSanitizer and UBSan")
    build.set_defaults(fn=cmd_native_build)
    env = actions.add_parser("env", help="print the `export` lines that put torch-adreno-step on PATH and let it use "
                             "pip's OpenCL drivers: eval \"$(python -m torch_adreno native env)\"")
    env.add_argument("--build-dir", type=Path, default=None, help="where it was built (default: build/native/host)")
    env.set_defaults(fn=cmd_native_env)


def cmd_native_build(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        built = build_native(args.target, args.build_dir, args.ndk, args.sanitize,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    except NativeBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(f"torch-adreno-step: {built.executable}")
    print(f"libtorch_adreno_step: {built.library}")
    if args.target == "host":
        where = "" if built.build_dir == default_build_dir("host") else f" --build-dir {shlex.quote(str(built.build_dir))}"
        print("to run it, put it and pip's OpenCL runtimes on PATH in this shell:")
        print(f'eval "$({_python()} -m torch_adreno native env{where})"')
    else:
        print("copy torch-adreno-step to the device and run it there (native/README.md: on a phone; "
              "native/tools/arm64_sysroot.py: an aarch64 build under qemu)")
    return 0


def cmd_native_env(args: argparse.Namespace) -> int:
    executable = (args.build_dir or default_build_dir("host")) / "torch-adreno-step"
    if executable.is_file():
        print(f"export PATH={shlex.quote(str(executable.parent))}:\"$PATH\"")
    else:
        print(f"# no torch-adreno-step at {executable}: build it with `{_python()} -m torch_adreno native build`")
    variables = opencl_environment()
    if not variables:
        print("# pip brought no OpenCL loader (pyopencl's): torch-adreno-step loads the system's libOpenCL.so")
    for name, value in variables.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0
