"""DeviceTensor: a host-side handle for a tensor whose data lives in an OpenCL buffer.

Tensors saved for the backward are returned by the forward as DeviceTensors; AOTAutograd stores
them and hands the same objects to the backward, which binds their buffers directly, so saved
activations never cross to the host. Any other use of a DeviceTensor (a saved-tensor hook, a
debugger printing it) materialises it on the host through ``__torch_dispatch__``: correct, and
counted as a "saved_activation" transfer so that it shows in the profile.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl
import torch
from torch.utils._pytree import tree_map

from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.events import BUS
from torch_adreno.runtime.pool import Block

#: NumPy type holding each torch dtype's bytes (NumPy has no bfloat16: its 16 bits as int16).
_NUMPY_STORAGE = {
    torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16, torch.int64: np.int64,
    torch.int32: np.int32, torch.bool: np.uint8, torch.uint8: np.uint8,
}


def own_tensor(memory: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
    """A contiguous tensor of ``shape`` (and ``dtype``) over ``memory``'s bytes that is not an
    autograd view of ``memory``: a graph's output must not be one, or autograd refuses in-place
    writes to it ("Output 0 of CompiledFunction is a view and is being modified inplace", where
    eager allows them: ``out[:, 0] = 0``, a loss scaled in place)."""
    dtype = memory.dtype if dtype is None else dtype
    offset_bytes = memory.storage_offset() * memory.element_size()
    item = torch.empty((), dtype=dtype).element_size()
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    out = torch.empty((0,), dtype=dtype)
    with torch.no_grad():
        out.set_(memory.untyped_storage(), offset_bytes // item, shape, tuple(reversed(strides)))
    return out


def download(runtime: DeviceRuntime, buffer: Any, shape: tuple[int, ...], dtype: torch.dtype,
             wait: bool = True) -> tuple[torch.Tensor, cl.Event | None]:
    """Copy a device buffer into a new host tensor (the copy completes once the event does)."""
    tensor, event, _ = download_owned(runtime, buffer, shape, dtype, wait)
    return tensor, event


def download_owned(runtime: DeviceRuntime, buffer: Any, shape: tuple[int, ...], dtype: torch.dtype,
                   wait: bool = True) -> tuple[torch.Tensor, cl.Event | None, np.ndarray]:
    """As :func:`download`, also giving the NumPy array that owns the tensor's memory (it lives
    exactly as long as some tensor over that memory does). ``buffer=None``: allocate only."""
    array = np.empty(shape, dtype=_NUMPY_STORAGE[dtype])
    event = None
    if array.size and buffer is not None:
        event = cl.enqueue_copy(runtime.queue, array, buffer, is_blocking=wait)
    tensor = torch.from_numpy(array)
    if dtype in (torch.bool, torch.bfloat16):
        tensor = own_tensor(tensor, tuple(shape), dtype)
    return tensor, event, array


class DeviceTensor(torch.Tensor):
    """A tensor of ``shape``/``dtype`` whose elements are in a pooled device buffer (contiguous).

    A backward graph may reuse the bytes of a saved activation after its last use (memory reuse):
    it then marks the block ``consumed``, and any later use of a tensor over it (this one, or
    another saved view of the same buffer) raises instead of reading garbage.
    """

    block: Block
    runtime: DeviceRuntime
    graph: str
    buffer_name: str

    @staticmethod
    def __new__(cls, block: Block, runtime: DeviceRuntime, shape: tuple[int, ...], dtype: torch.dtype,
                graph: str, buffer_name: str) -> DeviceTensor:
        self = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=torch.device("cpu"),
                                                 requires_grad=False)
        self.block = block
        self.runtime = runtime
        self.graph = graph
        self.buffer_name = buffer_name
        return self

    @property
    def consumed_by(self) -> str | None:
        return self.block.consumed_by

    @consumed_by.setter
    def consumed_by(self, graph: str | None) -> None:
        self.block.consumed_by = graph

    @property
    def cl_buffer(self) -> Any:
        self.check_live()
        return self.block.buffer

    def check_live(self) -> None:
        if self.consumed_by is not None:
            raise RuntimeError(
                f"tensor {self.buffer_name} saved by {self.graph} was already used by {self.consumed_by}, which "
                "reused its memory after its last use; running a backward twice (retain_graph=True) or reading "
                "saved tensors afterwards needs torch.compile(..., options={'memory_reuse': False})"
            )

    def to_host(self) -> torch.Tensor:
        """The tensor's values as an ordinary host tensor (a counted device-to-host copy)."""
        tensor, _ = download(self.runtime, self.cl_buffer, tuple(self.shape), self.dtype)
        BUS.transfer(self.graph, "d2h", tensor.numel() * tensor.element_size(), self.buffer_name, "saved_activation")
        return tensor

    def __repr__(self) -> str:  # type: ignore[override]
        return f"DeviceTensor(shape={tuple(self.shape)}, dtype={self.dtype}, buffer={self.buffer_name} of {self.graph})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        def unwrap(x: Any) -> Any:
            return x.to_host() if isinstance(x, DeviceTensor) else x

        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
