"""The native step runtime's library (``libtorch_adreno_step``, ``native/include/torch_adreno_step.h``)
in this process through ctypes: a step run locally with the same calls a :class:`RemoteStep` makes
over the network, so that tests and benchmarks compare the two in one process, on one device.

    from torch_adreno.cli.native import build_native
    with NativeStep(build_native().library, "step.onnx", device="Intel(R) OpenCL") as step:
        loss = step.step(x, y)

The library loads libOpenCL itself (``TORCH_ADRENO_OPENCL_LIBRARY``, else the usual names); in a
process that imported pyopencl, point it at pyopencl's loader (``opencl_environment()`` of
:mod:`torch_adreno.cli.native`) so that both see the same platforms.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from torch_adreno.remote.protocol import DTYPES

MAX_RANK = 8


class NativeStepError(RuntimeError):
    """A call of the C API failed: ``status`` (tas_status) and the library's message."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class _Options(ctypes.Structure):
    _fields_ = [("device", ctypes.c_char_p), ("opencl_library", ctypes.c_char_p), ("cache_dir", ctypes.c_char_p),
                ("profile", ctypes.c_int), ("fill_uninitialized_memory", ctypes.c_int)]


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_RANK), ("bytes", ctypes.c_size_t)]


class _Phases(ctypes.Structure):
    _fields_ = [("upload_ms", ctypes.c_double), ("enqueue_ms", ctypes.c_double), ("wait_ms", ctypes.c_double)]


class _Summary(ctypes.Structure):
    _fields_ = [("device", ctypes.c_char_p), ("driver", ctypes.c_char_p), ("operations", ctypes.c_size_t),
                ("kernels", ctypes.c_size_t), ("programs_built", ctypes.c_size_t),
                ("programs_cached", ctypes.c_size_t), ("device_bytes", ctypes.c_uint64)]


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    handle = ctypes.c_void_p
    lib.tas_step_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Options), ctypes.POINTER(handle)]
    lib.tas_step_open_memory.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(_Options),
                                         ctypes.POINTER(handle)]
    lib.tas_step_close.argtypes = [handle]
    lib.tas_step_close.restype = None
    lib.tas_step_error.argtypes = [handle]
    lib.tas_step_error.restype = ctypes.c_char_p
    lib.tas_step_batch_count.argtypes = lib.tas_step_state_count.argtypes = [handle]
    lib.tas_step_batch_count.restype = lib.tas_step_state_count.restype = ctypes.c_size_t
    lib.tas_step_batch_info.argtypes = lib.tas_step_state_info.argtypes = [handle, ctypes.c_size_t,
                                                                          ctypes.POINTER(_TensorInfo)]
    lib.tas_step_run.argtypes = [handle, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                                 ctypes.POINTER(ctypes.c_float)]
    lib.tas_step_read_state.argtypes = lib.tas_step_write_state.argtypes = [handle, ctypes.c_char_p, ctypes.c_void_p,
                                                                            ctypes.c_size_t]
    lib.tas_step_set_scalar.argtypes = [handle, ctypes.c_char_p, ctypes.c_double]
    lib.tas_step_last_phases.argtypes = [handle, ctypes.POINTER(_Phases)]
    lib.tas_step_summarize.argtypes = [handle, ctypes.POINTER(_Summary)]
    lib.tas_step_kernel_time.argtypes = [handle, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p),
                                         ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_size_t)]
    lib.tas_step_reset_times.argtypes = [handle]
    lib.tas_step_reset_times.restype = None
    lib.tas_step_set_recording.argtypes = [handle, ctypes.c_int]
    lib.tas_step_enqueue_path.argtypes = [handle, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def _layout(info: _TensorInfo) -> dict[str, Any]:
    return {"name": info.name.decode(), "dtype": DTYPES[info.dtype].name, "shape": list(info.shape[:info.rank]),
            "bytes": int(info.bytes)}


class NativeStep:
    """A step file (path or bytes) opened on a local OpenCL device by the native library."""

    def __init__(self, library: str | Path, step: str | Path | bytes, device: str | None = None,
                 cache_dir: str | Path | None = None, profile: bool = False,
                 fill_uninitialized_memory: bool | None = None) -> None:
        """``fill_uninitialized_memory``: fill the memory the step makes before its first write
        (``tas_open_options.fill_uninitialized_memory``); None: as the environment variable
        ``TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY`` says."""
        self._lib = _load(Path(library))
        self._handle = ctypes.c_void_p()
        self._profile = profile
        options = _Options(device.encode() if device else None, None, str(cache_dir).encode() if cache_dir else None,
                           1 if profile else 0,
                           0 if fill_uninitialized_memory is None else 1 if fill_uninitialized_memory else -1)
        if isinstance(step, bytes):
            status = self._lib.tas_step_open_memory(step, len(step), b"the step in memory", ctypes.byref(options),
                                                    ctypes.byref(self._handle))
        else:
            status = self._lib.tas_step_open(str(step).encode(), ctypes.byref(options), ctypes.byref(self._handle))
        if status != 0:
            message = self._message()
            self.close()
            raise NativeStepError(status, message)
        info = _TensorInfo()
        self.batch_inputs = []
        for i in range(self._lib.tas_step_batch_count(self._handle)):
            self._check(self._lib.tas_step_batch_info(self._handle, i, ctypes.byref(info)))
            self.batch_inputs.append(_layout(info))
        self.state_layout = []
        for i in range(self._lib.tas_step_state_count(self._handle)):
            self._check(self._lib.tas_step_state_info(self._handle, i, ctypes.byref(info)))
            self.state_layout.append(_layout(info))

    def _message(self) -> str:
        text = self._lib.tas_step_error(self._handle)
        return text.decode(errors="replace") if text else "out of memory"

    def _check(self, status: int) -> None:
        if status != 0:
            raise NativeStepError(status, self._message())

    def _require_open(self) -> None:
        if not self._handle:
            raise NativeStepError(1, "the step is closed")

    def step(self, *batch: Any) -> float:
        self._require_open()
        if len(batch) != len(self.batch_inputs):
            raise ValueError(f"the step takes {len(self.batch_inputs)} batch arrays, got {len(batch)}")
        arrays = []
        for value, entry in zip(batch, self.batch_inputs, strict=True):
            array = np.ascontiguousarray(value)
            if array.dtype != np.dtype(entry["dtype"]) or list(array.shape) != entry["shape"]:
                raise ValueError(f"batch input {entry['name']}: the step takes {entry['dtype']}{entry['shape']}, got "
                                 f"{array.dtype}{list(array.shape)}")
            arrays.append(array)
        pointers = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        sizes = (ctypes.c_size_t * max(len(arrays), 1))(*[a.nbytes for a in arrays])
        loss = ctypes.c_float()
        self._check(self._lib.tas_step_run(self._handle, pointers, sizes, ctypes.byref(loss)))
        return float(loss.value)

    def run(self, batches: Iterable[Sequence[Any]]) -> list[float]:
        return [self.step(*batch) for batch in batches]

    def read_state(self, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        self._require_open()
        by_name = {entry["name"]: entry for entry in self.state_layout}
        state = {}
        for name in names if names is not None else list(by_name):
            if name not in by_name:
                raise NativeStepError(1, f"the step has no state tensor {name}")
            entry = by_name[name]
            array = np.empty(entry["shape"], dtype=np.dtype(entry["dtype"]))
            self._check(self._lib.tas_step_read_state(self._handle, name.encode(), array.ctypes.data, array.nbytes))
            state[name] = array
        return state

    def write_state(self, state: Mapping[str, Any]) -> None:
        self._require_open()
        for name, value in state.items():
            array = np.ascontiguousarray(value)
            self._check(self._lib.tas_step_write_state(self._handle, name.encode(), array.ctypes.data, array.nbytes))

    def set_input(self, name: str, value: float) -> None:
        self._require_open()
        self._check(self._lib.tas_step_set_scalar(self._handle, name.encode(), float(value)))

    def last_phases(self) -> dict[str, float]:
        """The last step's host time: upload_ms, enqueue_ms, wait_ms (tas_step_last_phases)."""
        self._require_open()
        phases = _Phases()
        self._check(self._lib.tas_step_last_phases(self._handle, ctypes.byref(phases)))
        return {"upload_ms": phases.upload_ms, "enqueue_ms": phases.enqueue_ms, "wait_ms": phases.wait_ms}

    def set_recording(self, recording: bool) -> None:
        """Enqueue the step recorded once in the driver (True, the default, where it can) or
        operation by operation (tas_step_set_recording)."""
        self._require_open()
        self._check(self._lib.tas_step_set_recording(self._handle, int(recording)))

    @property
    def enqueue_path(self) -> str:
        """How a step is enqueued now (tas_step_enqueue_path): a command buffer, or operation by
        operation and why."""
        self._require_open()
        text = ctypes.c_char_p()
        self._check(self._lib.tas_step_enqueue_path(self._handle, ctypes.byref(text)))
        return (text.value or b"").decode()

    def profile(self, reset: bool = False) -> dict[str, Any]:
        """As :meth:`RemoteStep.profile`: the last step's phases and, opened with ``profile``, each
        operation's summed device time."""
        self._require_open()
        summary = _Summary()
        self._check(self._lib.tas_step_summarize(self._handle, ctypes.byref(summary)))
        operations = []
        name, milliseconds, runs = ctypes.c_char_p(), ctypes.c_double(), ctypes.c_size_t()
        for i in range(summary.operations if self._profile else 0):
            self._check(self._lib.tas_step_kernel_time(self._handle, i, ctypes.byref(name), ctypes.byref(milliseconds),
                                                       ctypes.byref(runs)))
            operations.append({"name": (name.value or b"").decode(), "milliseconds": milliseconds.value,
                               "runs": runs.value})
        if reset:
            self._lib.tas_step_reset_times(self._handle)
        return {"last_step": self.last_phases(), "profiled": self._profile, "operations": operations}

    def close(self) -> None:
        if self._handle:
            self._lib.tas_step_close(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self) -> NativeStep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
