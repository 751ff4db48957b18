"""A launch list recorded once into the OpenCL driver, then enqueued with one call per step.

A replayed step enqueues the same operations every step. Where the driver can record them, the
replay records each run of them once and enqueues the recording instead of one call per operation
(NVIDIA's OpenCL driver offers neither way below, and enqueues each launch of the list itself):

- ``cl_khr_command_buffer`` (Khronos): launches, copies and fills recorded into a command buffer
  (``clCommandNDRangeKernelKHR``, ``clCommandCopyBufferKHR``, ``clCommandFillBufferKHR``), run by
  ``clEnqueueCommandBufferKHR`` on the queue it was made for, in order with that queue's other
  commands. Its entry points are the driver's, found with
  ``clGetExtensionFunctionAddressForPlatform``; their signatures depend on the extension's version
  (CL_DEVICE_EXTENSIONS_WITH_VERSION): from 0.9.5 every recording call takes a properties list,
  before it only the launch did; before 0.9.8 a command buffer that is still running may be
  enqueued again only if made with ``CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR``.
- ``cl_qcom_recordable_queues`` (Qualcomm, Adreno): kernel launches enqueued on a queue made with
  ``CL_QUEUE_RECORDABLE_QCOM`` between ``clNewRecordingQCOM`` and ``clEndRecordingQCOM`` make a
  recording that ``clEnqueueRecordingQCOM`` runs on an ordinary queue; at most
  ``CL_DEVICE_RECORDABLE_QUEUE_MAX_SIZE`` launches each. Written from the declarations of
  Qualcomm's published ``cl_ext_qcom.h``; **it has not run on a device** (none was available), so
  it is used only when asked for (``replay_command_buffers=True``). Only launches are recorded (the
  header documents no other command): copies and fills are enqueued between recordings.

Invariant: a recording holds every kernel argument as it was set when it was recorded (the
command buffer specification captures a kernel's argument values in ``clCommandNDRangeKernelKHR``;
a recording's arguments change only through those passed to ``clEnqueueRecordingQCOM``, none here),
so nothing a replay binds anew each step may be in one: a replay that records copies its batch
into fixed memory instead of binding it in place (:mod:`torch_adreno.replay.step`). A recorded run
does exactly what enqueueing its operations one by one does, in the same order on the same queue.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import weakref
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

from torch_adreno.errors import OptionError
from torch_adreno.replay.native_loop import NativeLoop, native_loop, native_loop_status

__all__ = ["COMMAND_BUFFER", "RECORDABLE_QUEUE", "DriverRecording", "RecordedRuns", "RecordingRefused",
           "driver_recording"]

COMMAND_BUFFER = "command buffer"
RECORDABLE_QUEUE = "recordable queue"

# cl_khr_command_buffer (OpenCL-Headers, cl_ext.h)
_COMMAND_BUFFER_EXTENSION = "cl_khr_command_buffer"
_DEVICE_COMMAND_BUFFER_CAPABILITIES = 0x12A9
_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES = 0x12AA
_CAPABILITY_SIMULTANEOUS_USE = 1 << 2
_SIMULTANEOUS_USE = 1 << 0
# cl_qcom_recordable_queues (Qualcomm's cl_ext_qcom.h)
_RECORDABLE_QUEUES_EXTENSION = "cl_qcom_recordable_queues"
_DEVICE_RECORDABLE_QUEUE_MAX_SIZE = 0x41DE
_QUEUE_RECORDABLE = 1 << 30


class _CommandBufferApi(ctypes.Structure):
    """``struct ta_command_buffer_api`` of launch_list.c."""

    _fields_ = [("create", ctypes.c_void_p), ("finalize", ctypes.c_void_p), ("release", ctypes.c_void_p),
                ("enqueue", ctypes.c_void_p), ("command_nd_range_kernel", ctypes.c_void_p),
                ("command_copy_buffer", ctypes.c_void_p), ("command_fill_buffer", ctypes.c_void_p),
                ("properties_on_every_command", ctypes.c_int32), ("flags", ctypes.c_uint64)]


class _RecordableQueueApi(ctypes.Structure):
    """``struct ta_recordable_queue_api`` of launch_list.c."""

    _fields_ = [("new_recording", ctypes.c_void_p), ("end_recording", ctypes.c_void_p),
                ("release_recording", ctypes.c_void_p), ("enqueue_recording", ctypes.c_void_p)]


@dataclass(frozen=True)
class DriverRecording:
    """How a replay on one device enqueues its launch list: ``kind`` :data:`COMMAND_BUFFER` or
    :data:`RECORDABLE_QUEUE`, recorded in the driver; None, one call per operation. ``detail``: the
    extension and its version, or why neither is used. ``reenqueue_while_running``: whether a
    recording may be enqueued again while the previous run of it may still be executing (the next
    step's upload overlapping the device's work needs it)."""

    kind: str | None
    detail: str
    api: Any = None
    loop: NativeLoop | None = None
    reenqueue_while_running: bool = False
    #: Recordable queue: launches per recording (CL_DEVICE_RECORDABLE_QUEUE_MAX_SIZE).
    max_launches: int = 0

    def describe(self) -> str:
        return f"{self.kind} ({self.detail})" if self.kind else f"one call per operation ({self.detail})"


class RecordingRefused(RuntimeError):
    """The driver refused to record operation ``index`` of a run (-1: to make or finish the
    recording) with error ``code``."""

    def __init__(self, index: int, code: int) -> None:
        super().__init__(f"operation {index}, error {code}")
        self.index = index
        self.code = code


def _version(device: cl.Device, extension: str) -> tuple[int, int, int] | None:
    """The version the device reports for ``extension`` (OpenCL 3.0's CL_DEVICE_EXTENSIONS_WITH_VERSION)."""
    try:
        entries: Any = device.get_info(cl.device_info.EXTENSIONS_WITH_VERSION)
    except (cl.Error, AttributeError, TypeError):
        return None
    for entry in entries:
        if entry.name == extension:
            return entry.version >> 22, (entry.version >> 12) & 0x3FF, entry.version & 0xFFF
    return None


def _device_info(loop: NativeLoop, device: cl.Device, param: int, kind: Any) -> int | None:
    """A scalar ``clGetDeviceInfo`` value pyopencl does not name; None where the driver refuses."""
    value = kind(0)
    function = loop.driver.clGetDeviceInfo
    function.restype = ctypes.c_int32
    function.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    status = function(device.int_ptr, param, ctypes.sizeof(value), ctypes.byref(value), None)
    return int(value.value) if status == 0 else None


def _extension_functions(loop: NativeLoop, device: cl.Device, names: tuple[str, ...],
                         exported: bool = False) -> dict[str, int] | str:
    """The addresses of the driver's ``names`` (clGetExtensionFunctionAddressForPlatform; with
    ``exported``, else the OpenCL library's own export, as a vendor library loaded directly has
    them), or the names it lacks."""
    lookup = loop.driver.clGetExtensionFunctionAddressForPlatform
    lookup.restype = ctypes.c_void_p
    lookup.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    found: dict[str, int] = {}
    for name in names:
        address = lookup(device.platform.int_ptr, name.encode())
        if not address and exported:
            symbol = getattr(loop.driver, name, None)
            address = ctypes.cast(symbol, ctypes.c_void_p).value if symbol is not None else None
        if address:
            found[name] = address
    missing = [name for name in names if name not in found]
    return found if not missing else ", ".join(missing)


def _command_buffers(loop: NativeLoop, device: cl.Device) -> DriverRecording:
    extension = _COMMAND_BUFFER_EXTENSION
    if extension not in device.extensions.split():
        return DriverRecording(None, f"the device offers no {extension}")
    version = _version(device, extension)
    if version is None:
        return DriverRecording(None, f"the driver offers {extension} but not its version (CL_DEVICE_EXTENSIONS_"
                                     "WITH_VERSION), which decides its entry points' signatures")
    named = f"{extension} {'.'.join(map(str, version))}"
    required = _device_info(loop, device, _DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES, ctypes.c_uint64)
    if required:
        return DriverRecording(None, f"{named} needs queue properties {required:#x} of the queue a replay uses")
    functions = _extension_functions(loop, device, (
        "clCreateCommandBufferKHR", "clFinalizeCommandBufferKHR", "clReleaseCommandBufferKHR",
        "clEnqueueCommandBufferKHR", "clCommandNDRangeKernelKHR", "clCommandCopyBufferKHR", "clCommandFillBufferKHR"))
    if isinstance(functions, str):
        return DriverRecording(None, f"{named} is offered, but the driver has no {functions}")
    simultaneous = version >= (0, 9, 8)  # (before it, only with the flag, where the device allows it)
    flags = 0
    if not simultaneous:
        capabilities = _device_info(loop, device, _DEVICE_COMMAND_BUFFER_CAPABILITIES, ctypes.c_uint64) or 0
        if capabilities & _CAPABILITY_SIMULTANEOUS_USE:
            flags, simultaneous = _SIMULTANEOUS_USE, True
    api = _CommandBufferApi(*functions.values(), int(version >= (0, 9, 5)), flags)
    return DriverRecording(COMMAND_BUFFER, named, api, loop, simultaneous)


def _recordable_queues(loop: NativeLoop, device: cl.Device) -> DriverRecording:
    extension = _RECORDABLE_QUEUES_EXTENSION
    if extension not in device.extensions.split():
        return DriverRecording(None, f"the device offers no {extension}")
    largest = _device_info(loop, device, _DEVICE_RECORDABLE_QUEUE_MAX_SIZE, ctypes.c_uint32)
    if not largest:
        return DriverRecording(None, f"{extension} is offered, but CL_DEVICE_RECORDABLE_QUEUE_MAX_SIZE is "
                                     f"{'not reported' if largest is None else 0}")
    functions = _extension_functions(loop, device, ("clNewRecordingQCOM", "clEndRecordingQCOM",
                                                    "clReleaseRecordingQCOM", "clEnqueueRecordingQCOM"), exported=True)
    if isinstance(functions, str):
        return DriverRecording(None, f"{extension} is offered, but the driver has no {functions}")
    # (Whether a recording may be enqueued while it still runs, the header does not say: not assumed.)
    return DriverRecording(RECORDABLE_QUEUE, f"{extension}, up to {largest} launches a recording, not run on "
                                             "a device yet", _RecordableQueueApi(*functions.values()), loop,
                           max_launches=largest)


@functools.cache
def _offered(device: cl.Device) -> tuple[DriverRecording, DriverRecording]:
    loop = native_loop()
    if loop is None:
        unavailable = DriverRecording(None, f"the C loop that records is not available: {native_loop_status()}")
        return unavailable, unavailable
    return _command_buffers(loop, device), _recordable_queues(loop, device)


def driver_recording(device: cl.Device, wanted: str | bool, label: str = "") -> DriverRecording:
    """How replays on ``device`` enqueue their launch lists (the ``replay_command_buffers``
    option): ``"auto"``, a command buffer where a GPU offers ``cl_khr_command_buffer``; True,
    that on any device, else Qualcomm's recordable queues (not run on a device yet), else an
    :class:`~torch_adreno.errors.OptionError`; False, one call per operation.

    A CPU device is left launch by launch under ``"auto"``: there the host's enqueue costs
    little beside the kernels, and Intel's CPU runtime runs a recorded step at about half the
    speed of the same launches enqueued one by one (benchmarks/results/intel-cpu/host_enqueue.jsonl
    holds the enqueue side; ``python ../shared/peers/adreno_peer.py --model lenet --mode trainstep``
    shows the step)."""
    if wanted is False:
        return DriverRecording(None, "off: replay_command_buffers=False")
    if wanted == "auto" and not device.type & cl.device_type.GPU:
        return DriverRecording(None, "auto: launch by launch on a CPU device (replay_command_buffers=True records)")
    command_buffer, recordable_queue = _offered(device)
    if command_buffer.kind:
        return command_buffer
    if recordable_queue.kind and wanted is True:
        return recordable_queue
    if wanted is True:
        raise OptionError(f"replay_command_buffers=True, but {label or device.name.strip()} cannot record a launch "
                          f"list: {command_buffer.detail}; {recordable_queue.detail}. Use 'auto' or False")
    if recordable_queue.kind:
        return DriverRecording(None, f"{command_buffer.detail}; it offers {recordable_queue.detail.split(',')[0]}, "
                                     "used only with replay_command_buffers=True: that path has not run on a device")
    return DriverRecording(None, command_buffer.detail)


def _release(recording: DriverRecording, queue: cl.CommandQueue, handles: list[int],
             recordable_queue: list[int]) -> None:
    """Release a list's recordings (after its queue has run them), then its recordable queue."""
    if not handles and not recordable_queue:
        return
    with contextlib.suppress(cl.Error):  # (a lost device: release them all the same)
        queue.finish()
    release = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(
        recording.api.release if recording.kind == COMMAND_BUFFER else recording.api.release_recording)
    for handle in handles:
        release(handle)
    assert recording.loop is not None
    for queue_handle in recordable_queue:
        recording.loop.driver.clReleaseCommandQueue(ctypes.c_void_p(queue_handle))


class RecordedRuns:
    """The recordings of one launch list's runs on ``queue``, released with this object (after
    the queue has run them). :meth:`record` records a run of C-loop records; :meth:`enqueue` runs
    a recording."""

    def __init__(self, recording: DriverRecording, queue: cl.CommandQueue) -> None:
        assert recording.kind is not None and recording.loop is not None
        self.recording = recording
        self._queue = queue
        self._handles: list[int] = []
        self._recordable_queue: list[int] = []
        functions = recording.loop.loaded
        self._status, self._failed = ctypes.c_int32(0), ctypes.c_int64(0)
        if recording.kind == COMMAND_BUFFER:
            self._record, self._enqueue = functions.ta_record_command_buffer, functions.ta_enqueue_command_buffer
            self._record.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)]
        else:
            self._record, self._enqueue = functions.ta_record_launches, functions.ta_enqueue_recording
            self._record.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)]
        self._record.restype = ctypes.c_void_p
        self._enqueue.restype = ctypes.c_int32
        self._enqueue.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        weakref.finalize(self, _release, recording, queue, self._handles, self._recordable_queue)

    def _recordable(self) -> int:
        """The queue launches are recorded on (made once, with CL_QUEUE_RECORDABLE_QCOM alone)."""
        if not self._recordable_queue:
            loop, device = self.recording.loop, self._queue.device
            assert loop is not None
            create = loop.driver.clCreateCommandQueue
            create.restype = ctypes.c_void_p
            create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int32)]
            status = ctypes.c_int32(0)
            handle = create(self._queue.context.int_ptr, device.int_ptr, _QUEUE_RECORDABLE, ctypes.byref(status))
            if not handle or status.value:
                raise RecordingRefused(-1, status.value or 1)
            self._recordable_queue.append(handle)
        return self._recordable_queue[0]

    def record(self, records: Any, count: int) -> int:
        """A recording of ``count`` C-loop records (``records``, a ctypes array); a
        :class:`RecordingRefused` where the driver refuses."""
        loop = self.recording.loop
        assert loop is not None
        if self.recording.kind == COMMAND_BUFFER:
            handle = self._record(self._queue.int_ptr, records, count, ctypes.byref(self.recording.api),
                                  ctypes.byref(self._status), ctypes.byref(self._failed))
        else:
            handle = self._record(self._recordable(), records, count, ctypes.byref(self.recording.api),
                                  ctypes.byref(loop.entry_points), ctypes.byref(self._status),
                                  ctypes.byref(self._failed))
        if not handle:
            raise RecordingRefused(self._failed.value, self._status.value)
        self._handles.append(handle)
        return int(handle)

    def call(self, handle: int) -> tuple[Any, tuple[Any, ...]]:
        """The ctypes function and arguments that enqueue recording ``handle`` (then flush the
        queue); it returns the driver's error, 0 on success."""
        loop = self.recording.loop
        assert loop is not None
        return self._enqueue, (self._queue.int_ptr, handle, ctypes.byref(self.recording.api),
                               ctypes.byref(loop.entry_points))
