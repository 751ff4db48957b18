"""``native``: build the native step runtime (``native/``: ``torch-adreno-step`` and
``libtorch_adreno_step``) with CMake, and the environment that runs it on pip's OpenCL drivers.

    python -m torch_adreno native build                          # this machine
    python -m torch_adreno native build --target linux-aarch64   # 64-bit ARM Linux (glibc), through zig
    python -m torch_adreno native build --target android-arm64 --ndk $ANDROID_NDK_HOME
    eval "$(python -m torch_adreno native env)"                  # then torch-adreno-step finds pip's drivers

The compiler: the machine's ``cc`` for the host, or zig's clang (the ``ziglang`` pip package) where
there is none and for ``linux-aarch64``; the NDK's toolchain file for Android (bionic, which zig
does not provide). Builds go to ``build/native/<target>`` of the checkout unless ``--build-dir``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
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


def build_native(target: str = "host", build_dir: Path | None = None, ndk: Path | None = None,
                 sanitize: bool = False, build_type: str = "Release", jobs: int = 2) -> NativeBuild:
    """Configure and build ``native/`` for ``target``; returns the paths of what was built."""
    if target not in TARGETS:
        raise NativeBuildError(f"unknown target {target!r}; targets: {', '.join(TARGETS)}")
    if not (SOURCE / "CMakeLists.txt").is_file():
        raise NativeBuildError(f"the native sources are not at {SOURCE}: build from a checkout of torch_adreno "
                               "(pip install -e .)")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise NativeBuildError("cmake is not installed: pip install cmake (or the system's package)")
    build_dir = build_dir or SOURCE.parent / "build" / "native" / (target + ("-sanitize" if sanitize else ""))
    entries = {"CMAKE_BUILD_TYPE": build_type, "TAS_SANITIZE": "ON" if sanitize else "OFF",
               **_configuration(target, build_dir, ndk)}
    configure = [cmake, "-S", str(SOURCE), "-B", str(build_dir), *(f"-D{k}={v}" for k, v in entries.items())]
    for command in (configure, [cmake, "--build", str(build_dir), "--parallel", str(jobs)]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise NativeBuildError(f"{' '.join(command[:2])} ... failed:\n{(done.stdout + done.stderr)[-4000:]}")
    fuzz = build_dir / "fuzz-readers"
    return NativeBuild(build_dir, build_dir / "torch-adreno-step", build_dir / "libtorch_adreno_step.so",
                       fuzz if fuzz.is_file() else None, build_dir / "api-tour")


def opencl_environment(root: Path | None = None) -> dict[str, str]:
    """Variables that let the native runtime load an OpenCL ICD loader with pip's drivers (PoCL from
    pyopencl's wheel, Intel's CPU runtime): pyopencl's bundled loader, and a vendors folder naming
    each driver by its absolute path (pyopencl's own ``pocl.icd`` names a relative one, found only
    inside a process that has loaded pyopencl). Empty where pip brought no loader."""
    import importlib.util

    from torch_adreno.opencl_drivers import SYSTEM_VENDORS, _cache_dir, pip_driver_libraries, vendor_entries

    spec = importlib.util.find_spec("pyopencl")
    if spec is None or spec.origin is None:
        return {}
    libs = Path(spec.origin).parent / ".libs"
    loaders = sorted(libs.glob("libOpenCL*.so*"))
    if not loaders:
        return {}
    entries = vendor_entries(pip_driver_libraries(), SYSTEM_VENDORS)
    entries.update({f"pip-{icd.stem}.icd": f"{libs / icd.read_text().strip()}\n" for icd in libs.glob("*.icd")})
    root = root or _cache_dir(os.environ) / "native-opencl"
    vendors, home = root / "vendors", root / "pyopencl-home"
    vendors.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    for stale in vendors.glob("*.icd"):
        if stale.name not in entries:
            stale.unlink()
    for name, text in entries.items():
        (vendors / name).write_text(text)
    # pyopencl's loader (ocl-icd patched to also search $PYOPENCL_HOME/.libs) crashes when that
    # variable is unset; an empty folder keeps it from finding pocl.icd twice.
    return {"TORCH_ADRENO_OPENCL_LIBRARY": str(loaders[0]), "OCL_ICD_VENDORS": str(vendors), "PYOPENCL_HOME": str(home)}


def register(sub: argparse._SubParsersAction) -> None:
    native = sub.add_parser("native", help="build the native step runtime (torch-adreno-step, a C API for apps)")
    actions = native.add_subparsers(dest="action", required=True, metavar="<action>")
    build = actions.add_parser("build", help="build native/ with CMake and print the paths of what was built")
    build.add_argument("--target", choices=TARGETS, default="host", help="what to build for (default: %(default)s)")
    build.add_argument("--ndk", type=Path, default=None, help="the Android NDK (--target android-arm64)")
    build.add_argument("--build-dir", type=Path, default=None, help="default: build/native/<target> of the checkout")
    build.add_argument("--sanitize", action="store_true", help="with AddressSanitizer and UBSan")
    build.set_defaults(fn=cmd_native_build)
    env = actions.add_parser("env", help="print `export` lines that let torch-adreno-step use pip's OpenCL drivers")
    env.set_defaults(fn=cmd_native_env)


def cmd_native_build(args: argparse.Namespace) -> int:
    try:
        built = build_native(args.target, args.build_dir, args.ndk, args.sanitize)
    except NativeBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"torch-adreno-step: {built.executable}")
    print(f"libtorch_adreno_step: {built.library}")
    return 0


def cmd_native_env(args: argparse.Namespace) -> int:
    variables = opencl_environment()
    if not variables:
        print("# pip brought no OpenCL loader (pyopencl's): torch-adreno-step loads the system's libOpenCL.so")
    for name, value in variables.items():
        print(f"export {name}={value}")
    return 0
