"""Host tensors' memory as the device reads and writes it: NumPy views, buffers over it, coherence,
and the copies in flight between it and device buffers.

Invariants:
  * :func:`host_array` of a contiguous tensor is a view: writing it writes the tensor without
    moving its version counter (:func:`poison` relies on that).
  * Host memory a copy in flight reads or writes stays alive and unchanged until
    :meth:`Transfers.wait` returned (:class:`Transfers` holds it until then).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl
import torch

from torch_adreno.runtime.device import DeviceRuntime


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of a contiguous CPU tensor's elements (a copy if it is not contiguous)."""
    t = tensor.detach()
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    elif t.dtype == torch.bfloat16:  # NumPy has no bfloat16: its bits
        t = t.view(torch.int16)
    return t.contiguous().numpy()


def poison(tensor: torch.Tensor) -> None:
    """Mark a host copy that is not current: a NaN in its first element (floating point only), so
    that using it by mistake shows in any result computed from it. Written through NumPy, so the
    tensor's version counter does not move."""
    if tensor.numel() and tensor.is_floating_point():
        first = host_array(tensor).reshape(-1)
        # (bfloat16 is seen through its bits: 0x7FC0 is its quiet NaN)
        first[0] = 0x7FC0 if tensor.dtype == torch.bfloat16 else np.nan


def version_of(tensor: torch.Tensor) -> int | None:
    try:
        return int(tensor._version)
    except RuntimeError:  # inference tensors carry no version counter
        return None


def sync_shared(runtime: DeviceRuntime, buffer: cl.Buffer, nbytes: int, write: bool) -> None:
    """Make a host-pointer buffer coherent: after host writes (``write``) or before host reads."""
    if nbytes == 0:
        return
    flags = cl.map_flags.WRITE if write else cl.map_flags.READ
    result: Any = cl.enqueue_map_buffer(runtime.queue, buffer, flags, 0, (nbytes,), np.dtype(np.uint8),
                                        is_blocking=True)
    result[0].base.release(runtime.queue)


def shared_buffer(runtime: DeviceRuntime, tensor: torch.Tensor) -> cl.Buffer:
    """An OpenCL buffer over the tensor's own memory (the tensor must be contiguous)."""
    array = host_array(tensor)
    if array.nbytes == 0:
        return cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, 1)
    return cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=array)


class Transfers:
    """Copies between host memory and device buffers enqueued without waiting, each with the host
    memory it reads or writes, held (alive and, by contract, unchanged) until :meth:`wait`. Not
    waiting for each one lets the host go on enqueueing while the device copies (a blocking copy
    on an in-order queue also waits for every kernel before it)."""

    def __init__(self, runtime: DeviceRuntime) -> None:
        self.runtime = runtime
        self._in_flight: list[tuple[cl.Event, Any]] = []

    def upload(self, device_buffer: cl.Buffer, source: np.ndarray) -> cl.Event:
        event = cl.enqueue_copy(self.runtime.queue, device_buffer, source, is_blocking=False)
        self._in_flight.append((event, source))
        return event

    def download(self, target: np.ndarray, device_buffer: Any) -> cl.Event:
        event = cl.enqueue_copy(self.runtime.queue, target, device_buffer, is_blocking=False)
        self._in_flight.append((event, target))
        return event

    def wait(self) -> None:
        """Wait for every copy in flight; their host memory is released to its owners."""
        if self._in_flight:
            cl.wait_for_events([event for event, _ in self._in_flight])
            self._in_flight.clear()
