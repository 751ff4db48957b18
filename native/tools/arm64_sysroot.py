"""Run the aarch64 build of torch-adreno-step on an x86-64 Linux machine: under qemu-user, with
Debian's arm64 PoCL 3.1 as its OpenCL CPU runtime, all fetched without root and without
installing anything, and cached.

    python native/tools/arm64_sysroot.py prepare                 # fetch and unpack (cached); prints the folder
    python native/tools/arm64_sysroot.py run -- build/native/linux-aarch64/torch-adreno-step devices

What it does, once (about 115 MB fetched, 300 MB kept; then every run finds it in the cache, ``<cache>/arm64-emulation``, where
``<cache>`` is torch_adreno's cache root: ``$TORCH_ADRENO_CACHE``, else ``$XDG_CACHE_HOME/torch_adreno``
or ``~/.cache/torch_adreno``):

- ``apt-get update`` and ``apt-get download`` with a private sources list (Debian bookworm, signed
  by the Debian archive keyring), package lists and package cache, for the host's architecture
  (``qemu-user-static``) and arm64 (:data:`ARM64_PACKAGES`: PoCL 3.1, the ICD loader and what they
  load); any user can run this on Debian, no root;
- each arm64 package unpacked with ``dpkg-deb -x`` into a sysroot, its absolute symbolic links
  (the dynamic loader's among them) made relative so that they resolve inside it; from
  ``qemu-user-static`` only ``qemu-aarch64-static`` is kept;
- three things PoCL needs under emulation: an ICD file naming libpocl by its full path inside the
  sysroot (PoCL finds its kernel library relative to the path it was loaded from; by its bare name
  it fails, "Kernel library file ... doesn't exist"); an ``ld`` first on PATH for the linker PoCL's
  compiler spawns (qemu runs that child as a host program, and the host's ``ld`` has no aarch64
  emulation): zig's ``ld.lld`` with ``--sysroot``, given the sysroot's paths for the absolute ones
  that exist only there; and ``POCL_DEVICES=pthread`` (PoCL 3.1's name for its CPU driver).

The program runs with ``QEMU_LD_PREFIX`` at the sysroot, PoCL's kernel cache
(``POCL_CACHE_DIR``) and torch-adreno-step's program cache (``TORCH_ADRENO_STEP_CACHE``) in the
cache folder, so a second run builds no kernel. What this proves: aarch64 code and an ARM OpenCL
CPU runtime; not Android's libc (bionic), not a phone's OpenCL driver, GPU or speed.

Needs: Debian's ``apt-get``, ``dpkg-deb`` and the Debian archive keyring (a Debian host, or one
with the ``debian-archive-keyring`` package), the network on the first run, and the ``ziglang``
pip package. Imports nothing of torch_adreno.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

#: The arm64 packages PoCL 3.1 and its ICD loader need (Debian bookworm; libpocl2-common is of
#: architecture "all", the others arm64 builds), and the host's emulator.
ARCHITECTURE_ALL = ("libpocl2-common",)
ARM64_PACKAGES = ("libpocl2", "libpocl2-common", "ocl-icd-libopencl1", "libllvm15", "libclang-cpp15", "libhwloc15",
                  "libudev1", "libc6", "libc6-dev", "libgcc-s1", "libgcc-12-dev", "libstdc++6", "libedit2", "libbsd0",
                  "libmd0", "libffi8", "libtinfo6", "libxml2", "libicu72", "liblzma5", "libz3-4", "zlib1g")
EMULATOR_PACKAGE = "qemu-user-static"
EMULATOR = "qemu-aarch64-static"
SOURCES = "http://deb.debian.org/debian bookworm main"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
#: Written last: a folder with this file (holding :data:`RECIPE`) is complete.
STAMP = "ready"
RECIPE = f"{SOURCES}\n{EMULATOR_PACKAGE}\n{' '.join(ARM64_PACKAGES)}\nld wrapper 1\n"


class EmulationUnavailable(RuntimeError):
    """What this machine lacks to run aarch64 programs this way; the message names it."""


def cache_root(environ: dict[str, str] | None = None) -> Path:
    """torch_adreno's cache root (torch_adreno.opencl_drivers uses the same rule)."""
    environ = dict(os.environ) if environ is None else environ
    root = environ.get("TORCH_ADRENO_CACHE")
    if root:
        return Path(root)
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_adreno"


def default_folder() -> Path:
    return cache_root() / "arm64-emulation"


def _host_architecture() -> str:
    if shutil.which("dpkg") is None:
        raise EmulationUnavailable("dpkg is not installed: fetching Debian's arm64 packages needs a Debian host")
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()


def _run(command: Sequence[str], what: str, cwd: Path | None = None) -> None:
    done = subprocess.run(list(command), capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise EmulationUnavailable(f"{what} failed ({' '.join(command[:3])} ...):\n{(done.stdout + done.stderr)[-3000:]}")


def _apt_options(folder: Path, host: str) -> list[str]:
    apt = folder / "apt"
    for part in ("lists/partial", "cache/archives/partial", "sources.list.d"):
        (apt / part).mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(f"deb [arch={host},arm64 signed-by={KEYRING}] {SOURCES}\n")
    options = [f"-oDir::Etc::SourceList={apt / 'sources.list'}", f"-oDir::Etc::SourceParts={apt / 'sources.list.d'}",
               f"-oDir::State::Lists={apt / 'lists'}", f"-oDir::Cache={apt / 'cache'}",
               f"-oAPT::Architecture={host}", f"-oAPT::Architectures={host},arm64"]
    if os.geteuid() == 0:  # (as root apt downloads as user _apt, who cannot write a private folder)
        options.append("-oAPT::Sandbox::User=root")
    return options


def _download(folder: Path, progress: bool) -> list[Path]:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        raise EmulationUnavailable("ziglang is not installed (pip install ziglang): PoCL's linker under qemu is "
                                   "zig's ld.lld") from None
    host = _host_architecture()
    if host != "amd64":
        raise EmulationUnavailable(f"this host is {host}; running aarch64 programs under qemu is set up for amd64 hosts")
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise EmulationUnavailable(f"{tool} is not installed: fetching Debian's arm64 packages needs it")
    if not KEYRING.is_file():
        raise EmulationUnavailable(f"the Debian archive keyring is not installed ({KEYRING}: the debian-archive-keyring "
                                   "package): the packages' signatures cannot be checked without it")
    options = _apt_options(folder, host)
    debs = folder / "debs"
    debs.mkdir(exist_ok=True)
    wanted = [EMULATOR_PACKAGE, *(name if name in ARCHITECTURE_ALL else f"{name}:arm64" for name in ARM64_PACKAGES)]
    if progress:
        print(f"fetching {len(wanted)} Debian packages (about 115 MB) into {debs}", file=sys.stderr, flush=True)
    _run(["apt-get", "-q", *options, "update"], "apt-get update (Debian's package lists)")
    _run(["apt-get", "-q", *options, "download", *wanted], "apt-get download", cwd=debs)
    found = sorted(debs.glob("*.deb"))
    names = {deb.name.split("_")[0] for deb in found}
    missing = sorted({w.split(":")[0] for w in wanted} - names)
    if missing:
        raise EmulationUnavailable(f"apt-get download brought no {', '.join(missing)}")
    return found


def _relative_links(sysroot: Path) -> None:
    """Absolute symbolic links inside ``sysroot`` made relative, so that they resolve inside it."""
    for path in sysroot.rglob("*"):
        if path.is_symlink():
            target = os.readlink(path)
            if target.startswith("/"):
                path.unlink()
                path.symlink_to(os.path.relpath(sysroot / target.lstrip("/"), path.parent))


LD_WRAPPER = """#!/bin/sh
# PoCL's compiler links each kernel library with `ld`; under qemu that child runs as a host program.
# zig's ld.lld links aarch64, given the sysroot's paths for absolute ones that exist only there.
sysroot='{sysroot}'
for argument; do
    case "$argument" in
        -L/*) path="${{argument#-L}}"; if [ ! -e "$path" ] && [ -e "$sysroot$path" ]; then argument="-L$sysroot$path"; fi ;;
        /*) if [ ! -e "$argument" ] && [ -e "$sysroot$argument" ]; then argument="$sysroot$argument"; fi ;;
    esac
    set -- "$@" "$argument"
    shift
done
exec '{python}' -m ziglang ld.lld --sysroot="$sysroot" "$@"
"""


def _unpack(folder: Path, debs: list[Path]) -> None:
    sysroot, emulator = folder / "sysroot", folder / "qemu"
    for partial in (sysroot, emulator):
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    for deb in debs:
        is_emulator = deb.name.startswith(EMULATOR_PACKAGE + "_")
        _run(["dpkg-deb", "-x", str(deb), str(emulator if is_emulator else sysroot)], f"dpkg-deb -x {deb.name}")
    binary = emulator / "usr" / "bin" / EMULATOR
    if not binary.is_file():
        raise EmulationUnavailable(f"{EMULATOR_PACKAGE} holds no usr/bin/{EMULATOR}")
    binary.replace(emulator / EMULATOR)
    shutil.rmtree(emulator / "usr")  # (the other architectures' emulators: about 300 MB)
    _relative_links(sysroot)
    libpocl = sorted((sysroot / "usr" / "lib" / "aarch64-linux-gnu").glob("libpocl.so.2*"))
    if not libpocl:
        raise EmulationUnavailable("libpocl2 unpacked no usr/lib/aarch64-linux-gnu/libpocl.so.2")
    vendors = folder / "vendors"
    vendors.mkdir(exist_ok=True)
    (vendors / "pocl.icd").write_text(f"{libpocl[0]}\n")
    tools = folder / "bin"
    tools.mkdir(exist_ok=True)
    (tools / "ld").write_text(LD_WRAPPER.format(sysroot=sysroot, python=sys.executable))
    (tools / "ld").chmod(0o755)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One preparer at a time (a parallel test run shares the cache)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prepare(folder: Path | None = None, progress: bool = False) -> Path:
    """The emulation folder, fetched and unpacked unless the cache holds it complete."""
    folder = folder or default_folder()
    with _locked(folder):
        stamp = folder / STAMP
        if stamp.is_file() and stamp.read_text() == RECIPE:
            return folder
        stamp.unlink(missing_ok=True)
        started = time.perf_counter()
        _unpack(folder, _download(folder, progress))
        for fetched in ("debs", "apt"):  # (unpacked: 150 MB no run needs)
            shutil.rmtree(folder / fetched)
        stamp.write_text(RECIPE)
        if progress:
            print(f"prepared {folder} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return folder


def environment(folder: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an aarch64 program run with :func:`command` (see the module docstring)."""
    env = dict(os.environ if base is None else base)
    for name in ("OCL_ICD_FILENAMES", "PYOPENCL_HOME", "TORCH_ADRENO_DEVICE"):
        env.pop(name, None)
    (folder / "pocl-cache").mkdir(exist_ok=True)
    env.update(QEMU_LD_PREFIX=str(folder / "sysroot"), OCL_ICD_VENDORS=str(folder / "vendors"),
               POCL_DEVICES="pthread", POCL_CACHE_DIR=str(folder / "pocl-cache"),
               TORCH_ADRENO_STEP_CACHE=str(folder / "program-cache"),
               TORCH_ADRENO_OPENCL_LIBRARY="/usr/lib/aarch64-linux-gnu/libOpenCL.so.1",
               PATH=f"{folder / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    return env


def command(folder: Path, program: str | Path, *arguments: str) -> list[str]:
    """The command line that runs the aarch64 ``program`` under qemu."""
    return [str(folder / "qemu" / EMULATOR), str(program), *arguments]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=None, help="default: <torch_adreno cache>/arm64-emulation")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("prepare", help="fetch and unpack what is missing; print the folder")
    run = sub.add_parser("run", help="run an aarch64 program under qemu with PoCL: run -- PROGRAM ARGS...")
    run.add_argument("program")
    run.add_argument("arguments", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        folder = prepare(args.folder, progress=True)
    except EmulationUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.action == "prepare":
        print(folder)
        return 0
    arguments = args.arguments[1:] if args.arguments[:1] == ["--"] else args.arguments
    return subprocess.run(command(folder, args.program, *arguments), env=environment(folder)).returncode


if __name__ == "__main__":
    sys.exit(main())
