"""OpenCL device discovery, selection and the per-device runtime (context, queue, memory pool).

Selection order: the backend's ``device`` option, then ``TORCH_ADRENO_DEVICE``, then the first
working GPU, then the first working device. A device is named by its index in :func:`list_devices`
or by a case-insensitive substring of "platform: device" that no other device's name contains (or
the whole name of one device); an empty or ambiguous name is an error that lists the matches.

Every device is probed once per process before it is used: a trivial kernel is built on it (the
build that also measures its preferred work-group multiple). A device whose driver cannot build it
(pyopencl's PoCL on a CPU its LLVM does not know) is *unusable*: listed with the driver's reason,
skipped by the default choice (logged once), an error naming the reason and the working devices
when chosen explicitly. Invariant: :func:`get_runtime` only ever returns a runtime of a device
whose probe built.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

from torch_adreno.errors import AmbiguousDeviceError, DeviceNotFoundError, OptionError
from torch_adreno.remote.client import parse_remote
from torch_adreno.runtime.index_check import IndexErrorRecord
from torch_adreno.runtime.pool import BufferPool
from torch_adreno.targets import DeviceProfile

ENV_DEVICE = "TORCH_ADRENO_DEVICE"
_log = logging.getLogger("torch_adreno")

#: What to install when no device works (printed with the reasons).
INSTALL_HINT = (
    "Install an OpenCL driver that works on this machine: `pip install intel-opencl-rt` (Intel's CPU "
    "runtime, any x86-64 CPU; torch_adreno registers it itself), the system's PoCL (`apt-get install "
    "pocl-opencl-icd`), or your GPU vendor's OpenCL driver.")

PROBE_SOURCE = "__kernel void probe(__global float* x) { x[get_global_id(0)] = 0.0f; }"


@dataclass(frozen=True)
class DeviceEntry:
    index: int
    platform: str
    device: cl.Device

    @property
    def label(self) -> str:
        return f"{self.platform}: {self.device.name.strip()}"

    @property
    def unusable(self) -> str | None:
        """Why kernels cannot be built on this device (its probe failed), or None: it works."""
        return probe(self.device).reason


@dataclass(frozen=True)
class Probe:
    """A device's probe: the preferred work-group multiple its build reported, or why it failed."""

    preferred_multiple: int = 0
    reason: str | None = None


_probes: dict[int, Probe] = {}
_probe_lock = threading.Lock()


def _build_probe(device: cl.Device) -> int:
    """Build the probe kernel on ``device``; its preferred work-group multiple (raises on failure)."""
    context = cl.Context([device])
    with warnings.catch_warnings():  # a driver's build log for a kernel that built is not news
        warnings.simplefilter("ignore", cl.CompilerWarning)
        program = cl.Program(context, PROBE_SOURCE).build()
    return int(program.probe.get_work_group_info(cl.kernel_work_group_info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE,
                                                 device))


def _failure_reason(error: Exception) -> str:
    """The driver's words: the first line of the build log that says what failed."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if "error" in line.lower() and not line.startswith("clBuildProgram failed")]
    first = said[0] if said else (lines[0] if lines else type(error).__name__)
    return f"its OpenCL driver cannot build a kernel: {first}"


def probe(device: cl.Device) -> Probe:
    """The (cached) probe of ``device``: built once per process."""
    key = device.int_ptr
    with _probe_lock:
        known = _probes.get(key)
        if known is not None:
            return known
        try:
            result = Probe(preferred_multiple=_build_probe(device))
        except (cl.Error, RuntimeError) as error:
            result = Probe(reason=_failure_reason(error))
        _probes[key] = result
        return result


def list_devices() -> list[DeviceEntry]:
    """Every OpenCL device of every platform, in a stable order."""
    entries: list[DeviceEntry] = []
    try:
        platforms = cl.get_platforms()
    except cl.LogicError:
        platforms = []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        for device in devices:
            entries.append(DeviceEntry(len(entries), platform.name.strip(), device))
    return entries


def _listing(entries: list[DeviceEntry]) -> str:
    return "\n".join(f"  [{e.index}] {e.label}" + (f" (unusable: {e.unusable})" if e.unusable else "")
                     for e in entries) or "  (none)"


def _no_device_help(entries: list[DeviceEntry], asked: str | int | None) -> str:
    available = _listing(entries)
    hint = (
        f"No OpenCL platform was found. {INSTALL_HINT}"
        if not entries else
        f"Pass options={{'device': <index or name substring>}} or set {ENV_DEVICE}."
    )
    what = f"no OpenCL device matches {asked!r}" if asked is not None else "no OpenCL device is available"
    return f"{what}. Available devices:\n{available}\n{hint}"


_skipped_logged: set[int] = set()


def _default_device(entries: list[DeviceEntry]) -> DeviceEntry:
    """The first working GPU, else the first working device; the unusable ones passed over are
    logged (once each)."""
    ordered = [e for e in entries if e.device.type & cl.device_type.GPU] + \
        [e for e in entries if not e.device.type & cl.device_type.GPU]
    for entry in ordered:
        if entry.unusable is None:
            return entry
        if entry.index not in _skipped_logged:
            _skipped_logged.add(entry.index)
            _log.warning("OpenCL device [%d] %s is skipped: %s", entry.index, entry.label, entry.unusable)
    raise DeviceNotFoundError(f"no OpenCL device here can build a kernel:\n{_listing(entries)}\n{INSTALL_HINT}")


def _usable(entry: DeviceEntry, entries: list[DeviceEntry], asked: str | int) -> DeviceEntry:
    if entry.unusable is None:
        return entry
    working = [e for e in entries if e.unusable is None]
    others = ("\n".join(f"  [{e.index}] {e.label}" for e in working) if working
              else f"  (none)\n{INSTALL_HINT}")
    raise DeviceNotFoundError(f"OpenCL device {asked!r}, [{entry.index}] {entry.label}, cannot be used: "
                              f"{entry.unusable}. Devices that work:\n{others}")


def select_device(spec: str | int | None = None, use_environment: bool = True) -> DeviceEntry:
    """The device named by ``spec`` (or, with ``use_environment``, the environment's; or the default
    rule); always one whose probe built (see the module docstring). A remote device
    (``remote:HOST:PORT``) is no OpenCL device of this process: an error saying what runs there."""
    entries = list_devices()
    if spec is None and use_environment:
        env = os.environ.get(ENV_DEVICE, "").strip()
        spec = (int(env) if env.isdigit() else env) if env else None
    if parse_remote(spec) is not None:
        raise OptionError(
            f"device {spec!r} is a remote device (a step server, torch-adreno-step serve): only a TrainingStep runs "
            "there (torch_adreno.TrainingStep(model, loss_fn, optimizer, options={'device': ...}), which compiles "
            "here and ships its captured step); a torch.compile'd model runs on a device of this machine")
    if not entries:
        raise DeviceNotFoundError(_no_device_help(entries, spec))
    if spec is None:
        return _default_device(entries)
    return _usable(_match(entries, spec), entries, spec)


def _match(entries: list[DeviceEntry], spec: str | int) -> DeviceEntry:
    if isinstance(spec, int):
        if 0 <= spec < len(entries):
            return entries[spec]
        raise DeviceNotFoundError(_no_device_help(entries, spec))
    if not spec.strip():
        raise DeviceNotFoundError(f"an empty device name selects nothing; pass an index or a name substring, "
                                  f"or leave {ENV_DEVICE} unset for the default device")
    wanted = spec.strip().lower()
    matches = [e for e in entries if wanted in e.label.lower()]
    if not matches:
        raise DeviceNotFoundError(_no_device_help(entries, spec))
    if len(matches) > 1:
        # A name given in full picks its device even where it is also part of another's name.
        exact = [e for e in matches if wanted in (e.label.lower(), e.device.name.strip().lower())]
        if len(exact) == 1:
            return exact[0]
        listed = "\n".join(f"  [{e.index}] {e.label}" for e in matches)
        raise AmbiguousDeviceError(
            f"device {spec!r} matches {len(matches)} OpenCL devices:\n{listed}\nPass the index or a longer part "
            f"of the name, as options={{'device': ...}} or {ENV_DEVICE}.")
    return matches[0]


#: CL_DEVICE_IMAGE_PITCH_ALIGNMENT and CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT (OpenCL 2.0 /
#: cl_khr_image2d_from_buffer), which pyopencl does not name.
_IMAGE_PITCH_ALIGNMENT, _IMAGE_BASE_ADDRESS_ALIGNMENT = 0x104A, 0x104B


def _optional_info(device: cl.Device, param: int) -> int:
    try:
        value: Any = device.get_info(param)  # type: ignore[arg-type]
        return int(value)
    except (cl.Error, TypeError, ValueError):
        return 0


def profile_of(entry: DeviceEntry) -> DeviceProfile:
    d = entry.device
    extensions = d.extensions.split()
    images = bool(d.image_support)
    return DeviceProfile(
        name=d.name.strip(),
        vendor=d.vendor.strip(),
        driver=d.driver_version.strip(),
        platform=entry.platform,
        opencl_version=d.version.strip(),
        is_gpu=bool(d.type & cl.device_type.GPU),
        compute_units=int(d.max_compute_units),
        max_work_group_size=int(d.max_work_group_size),
        max_work_item_sizes=tuple(int(s) for s in d.max_work_item_sizes),
        preferred_work_group_multiple=probe(d).preferred_multiple,
        local_mem_bytes=int(d.local_mem_size),
        global_mem_bytes=int(d.global_mem_size),
        max_alloc_bytes=int(d.max_mem_alloc_size),
        base_addr_align_bytes=max(int(d.mem_base_addr_align) // 8, 4),
        unified_memory=bool(getattr(d, "host_unified_memory", False)),
        fp16="cl_khr_fp16" in extensions,
        images=images,
        max_parameter_bytes=int(d.max_parameter_size),
        recordable_queues="cl_qcom_recordable_queues" in extensions,
        command_buffers="cl_khr_command_buffer" in extensions,
        address_bits=int(d.address_bits),
        image2d_max_width=int(d.image2d_max_width) if images else 0,
        image2d_max_height=int(d.image2d_max_height) if images else 0,
        image_from_buffer=images and "cl_khr_image2d_from_buffer" in extensions,
        image_pitch_alignment=_optional_info(d, _IMAGE_PITCH_ALIGNMENT) if images else 0,
        image_base_address_alignment=_optional_info(d, _IMAGE_BASE_ADDRESS_ALIGNMENT) if images else 0,
        prefers_images=images and ("adreno" in d.name.lower() or "qualcomm" in d.vendor.lower()),
    )


class DeviceRuntime:
    """The context, in-order queue (with profiling) and pooled allocator of one device."""

    def __init__(self, entry: DeviceEntry) -> None:
        self.entry = entry
        self.device = entry.device
        self.context = cl.Context([entry.device])
        self.queue = cl.CommandQueue(self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.profile = profile_of(entry)
        self.pool = BufferPool(self.context)
        #: Where kernels record an out-of-range data-dependent index (read at the host's waits).
        self.index_errors = IndexErrorRecord(self.context)
        #: Graph calls enqueued on :attr:`queue` so far (a replay, on a queue of its own, waits for
        #: the runtime's queue only when this moved since its last call).
        self.graph_calls = 0
        #: A replayed step still running on its own queue after it returned, as (that queue, the
        #: event of its end): :attr:`queue` waits for it already; another replay's queue must too
        #: (torch_adreno.replay.overlap). None: no step is in flight.
        self.replay_in_flight: tuple[cl.CommandQueue, cl.Event] | None = None

    def __repr__(self) -> str:
        return f"DeviceRuntime({self.entry.label})"


_runtimes: dict[int, DeviceRuntime] = {}
_lock = threading.Lock()


@atexit.register
def _shutdown() -> None:
    """Finish every queue and hand pooled buffers back while the OpenCL driver is still loaded:
    some drivers fault when objects are released during interpreter teardown."""
    for rt in list(_runtimes.values()):
        try:
            rt.queue.finish()
            rt.pool.release_free()
        except cl.Error:
            pass


def get_runtime(spec: str | int | None = None) -> DeviceRuntime:
    """The (shared) runtime of the selected device (a working one: see :func:`select_device`)."""
    entry = select_device(spec)
    with _lock:
        rt = _runtimes.get(entry.index)
        if rt is None:
            rt = _runtimes[entry.index] = DeviceRuntime(entry)
        return rt
