"""The Executable: one compiled graph as a static list of kernel launches on one device.

Built once per graph: kernels are built, arenas allocated from the memory plan and every kernel
argument that does not change between calls is bound. A call then binds inputs (resident device
copies, or the buffers of DeviceTensors from an earlier graph), allocates the outputs that escape
the call, enqueues the launches in order, and copies back only the outputs the caller reads on
the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyopencl as cl
import torch

from torch_adreno import ir
from torch_adreno.ir.torch_dtypes import IR_TO_TORCH
from torch_adreno.kernels import HostStep, KernelProgram, KernelSource
from torch_adreno.kernels.fills import fill_schedule
from torch_adreno.memory import StorageKind
from torch_adreno.runtime.build import build_kernels
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.device_tensor import DeviceTensor, download, download_owned, own_tensor
from torch_adreno.runtime.donated_inputs import DonatedInputs
from torch_adreno.runtime.enqueue import enqueue_fill
from torch_adreno.runtime.events import BUS, GraphRunRecord, HostOpRecord, LaunchRecord
from torch_adreno.runtime.graph_calls import GraphCall, active_observer
from torch_adreno.runtime.images import image_views
from torch_adreno.runtime.residency import Residency, host_array, poison, shared_buffer, sync_shared
from torch_adreno.runtime.tuning import TuningResult, tune_kernels


@dataclass
class _Launch:
    kernel: cl.Kernel
    source: KernelSource
    dynamic_args: list[tuple[int, str]]
    empty: bool


class Executable:
    """Callable with AOTAutograd's boxed convention: ``exe(list_of_args) -> list_of_outputs``."""

    def __init__(self, program: KernelProgram, runtime: DeviceRuntime, residency: Residency,
                 static_inputs: Sequence[int] = (), tune: bool = False,
                 version_bumped_inputs: Sequence[int] = (), verify_memory: bool = False,
                 restrided_outputs: Sequence[tuple[int, tuple[int, ...]]] = (),
                 fill_uninitialized_memory: bool = False) -> None:
        """``tune``: launch each kernel as tuned on this device (see :mod:`torch_adreno.runtime.tuning`;
        cached on disk) instead of with the kernels stage's heuristic geometry.
        ``version_bumped_inputs``: positions whose version counter the caller (AOTAutograd) bumps
        by one right before every call because this graph updates them in place; taken only for
        inputs the graph does update (``graph.mutations``).
        ``verify_memory``: check the memory plan against each new pattern of inputs sharing memory
        (:func:`torch_adreno.memory.verify.verify_program`) before a call with it enqueues anything.
        ``restrided_outputs``: (position, strides) of host outputs returned in eager's layout rather
        than our row-major one: each is downloaded (never left deferred to the device), then copied
        on the host into a tensor of those strides, and the call reports it as a host copy
        (:attr:`GraphCall.host_copies`).
        ``fill_uninitialized_memory``: each call fills the memory it makes with NaN words right before
        the first launch that touches it (:func:`~torch_adreno.kernels.fills.fill_schedule`),
        so that a read of bytes nothing wrote in this call shows."""
        # An instance attribute, so that wrappers made with functools.wraps (Dynamo's disable()
        # around the backward) keep telling AOTAutograd that we take boxed arguments.
        self._boxed_call = True
        self.program = program
        self.graph = program.graph
        self.runtime = runtime
        self.residency = residency
        self.static_inputs = set(static_inputs)
        self.version_bumped_inputs = {pos for pos in version_bumped_inputs
                                      if pos < len(self.graph.inputs) and self.graph.inputs[pos] in self.graph.mutations}
        plan = program.plan
        self._arenas = [cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, max(n, 1)) for n in plan.arena_bytes]
        # One device buffer per slot; every buffer of a slot binds that very object (no sub-buffers).
        self._static: dict[str, Any] = {
            name: self._arenas[alloc.arena] for name, alloc in plan.allocations.items()
            if alloc.kind is StorageKind.ARENA
        }
        self.allocated_bytes = sum(max(n, 1) for n in plan.arena_bytes)
        self._steps: list[_Launch | HostStep] = []
        #: Per kernel name, how its launch was tuned (empty unless ``tune``).
        self.tuning: dict[str, TuningResult] = tune_kernels(runtime, self.graph, program.kernels,
                                                                   profile=program.profile,
                                                                   choices=program.choices) if tune else {}
        # A tuned launch may carry other build options: the program is built from the chosen ones.
        chosen = {k.name: self.tuning[k.name].chosen if k.name in self.tuning else k for k in program.kernels}
        built = build_kernels(runtime, list(chosen.values()))
        for step in program.steps:
            if isinstance(step, HostStep):
                self._steps.append(step)
                continue
            source = chosen[step.name]
            kernel = built[source.name]
            dynamic = []
            for i, name in enumerate(source.params):
                if name in self._static:
                    kernel.set_arg(i, self._static[name])
                else:
                    dynamic.append((i, name))
            if source.checks_indices:
                runtime.index_errors.register(source, self.graph)
                runtime.index_errors.bind(kernel, source)
            self._steps.append(_Launch(kernel, source, dynamic, 0 in source.global_size))
        #: Launches per call that check data-dependent indices (each read of the record covers them).
        self._checking_launches = sum(1 for s in self._steps if isinstance(s, _Launch) and not s.empty
                                      and s.source.checks_indices)
        self._input_positions = {name: pos for pos, name in enumerate(self.graph.inputs) if name is not None}
        #: The graph's tensor constants, bound after the caller's arguments; pinned like parameters,
        #: so that their device copies are made once (and a replay binds those).
        self._constants = list(self.graph.constants.values())
        self.static_inputs |= {self._input_positions[name] for name in self.graph.constants}
        # The allocations each call must bind anew (arena slots and inputs are bound above / by
        # _bind_inputs), in plan order: a call walks these, not every buffer of the graph.
        self._per_call_allocations = [(name, alloc) for name, alloc in plan.allocations.items()
                                      if alloc.kind not in (StorageKind.ARENA, StorageKind.INPUT)]
        # The buffers of the last call stay referenced until the next call binds new ones: a kernel
        # object never points at a released buffer (some drivers fault when it does).
        self._last_call: dict[str, Any] = {}
        self._images = image_views(runtime)
        self._last_images: list[Any] = []
        self.verify_memory = verify_memory
        self._donors = DonatedInputs(program, self._input_positions, verify_memory, fill_uninitialized_memory)
        #: Per step, the regions filled right before it (None: no fills).
        self._fills = fill_schedule(program) if fill_uninitialized_memory else None
        self._restrided = dict(restrided_outputs)

    @property
    def kernel_launches(self) -> int:
        return sum(1 for s in self._steps if isinstance(s, _Launch) and not s.empty)

    def _bind_inputs(self, args: Sequence[Any]) -> dict[str, Any]:
        bound: dict[str, Any] = {}
        for pos, name in enumerate(self.graph.inputs):
            if name is None:
                continue
            value = args[pos]
            check_input(self.graph, name, value)
            if isinstance(value, DeviceTensor):
                value.check_live()
                if value.runtime is not self.runtime:
                    raise ValueError(f"{self.graph.name}: input {name} lives on another device ({value.runtime})")
                bound[name] = value.cl_buffer
            else:
                bound[name] = self.residency.buffer_for(value, pinned=pos in self.static_inputs,
                                                        graph=self.graph.name, buffer=name,
                                                        version_bumped=pos in self.version_bumped_inputs)
        return bound

    def __call__(self, args: list[Any]) -> list[Any]:
        self.runtime.graph_calls += 1
        if self._constants or self.graph.random_seeds:
            args = [*args, *self._constants, *draw_random_seeds(self.graph)]
        storage = dict(self._static)
        storage.update(self._bind_inputs(args))
        host_outputs: dict[str, torch.Tensor] = {}
        blocks: dict[str, Any] = {}
        sharing = self._donors.sharing(args)
        for name, alloc in self._per_call_allocations:
            if alloc.kind is StorageKind.PER_CALL:
                blocks[name] = self.runtime.pool.allocate(alloc.nbytes)
                storage[name] = blocks[name].buffer
            elif alloc.kind is StorageKind.DONATED:
                assert alloc.donor is not None
                storage[name] = self._donors.storage(alloc.donor, args, storage, blocks, sharing, self.runtime.pool)
            elif alloc.kind is StorageKind.HOST:
                buf = self.graph.buffers[name]
                host_outputs[name] = torch.empty(buf.shape, dtype=IR_TO_TORCH[buf.dtype])
                storage[name] = shared_buffer(self.runtime, host_outputs[name])
            elif alloc.kind is StorageKind.INPUT_ALIAS:
                assert alloc.in_place_of is not None
                storage[name] = storage[alloc.in_place_of]
        queue = self.runtime.queue
        images: list[Any] = []
        record = BUS.active
        if record:
            plan = self.program.plan
            unshared = plan.unshared_bytes + plan.per_call_bytes + plan.host_bytes
            BUS.graph(GraphRunRecord(self.graph.name, plan.planned_peak_bytes, unshared,
                                     self.allocated_bytes + plan.per_call_bytes, plan.per_call_bytes))
        fills = self._fills
        for index, step in enumerate(self._steps):
            if fills is not None:
                for region in fills[index]:
                    enqueue_fill(queue, storage[region.buffer], region.offset, region.nbytes)
            if isinstance(step, HostStep):
                run_host_step(self.runtime, self.graph, step, storage)
                continue
            if step.empty:
                continue
            for i, name in step.dynamic_args:
                step.kernel.set_arg(i, storage[name])
            if step.source.images:
                # Images over this call's buffers; a copied one is refreshed right before the read.
                for image in self._images.bind(step.kernel, step.source, storage.__getitem__):
                    image.refresh(queue)
                    images.append(image)
            event = cl.enqueue_nd_range_kernel(queue, step.kernel, step.source.global_size, step.source.local_size)
            if record:
                BUS.launch(LaunchRecord(self.graph.name, step.source, event, self.runtime.entry.label))
        self.runtime.index_errors.launches += self._checking_launches
        self._apply_mutations(args, storage)
        outputs = self._collect_outputs(args, storage, host_outputs, blocks)
        host_copies = restride(outputs, self._restrided)
        observer = active_observer()
        if observer is not None:
            observer.graph_called(GraphCall(
                self.runtime, self.program, args, storage, host_outputs, outputs,
                tuple((s.kernel, s.source) for s in self._steps if isinstance(s, _Launch) and not s.empty),
                tuple(s for s in self._steps if isinstance(s, HostStep)), self._input_positions, host_copies))
        self.residency.finish_transfers()
        self._last_call = storage
        self._last_images = images
        self._donors.mark_consumed(args)
        return outputs

    def _apply_mutations(self, args: Sequence[Any], storage: dict[str, Any]) -> None:
        """New values of mutated inputs into the inputs' storage, and their host copies made right."""
        plan = self.program.plan
        for target, value in self.graph.mutations.items():
            if plan.allocations[value].kind is not StorageKind.INPUT_ALIAS:
                nbytes = self.graph.buffers[value].nbytes
                if nbytes:
                    cl.enqueue_copy(self.runtime.queue, storage[target], storage[value], byte_count=nbytes)
            arg = args[self._input_positions[target]]
            if isinstance(arg, DeviceTensor):
                raise ValueError(f"{self.graph.name}: input {target} is updated in place but lives only on the device")
            self.residency.write_back(arg, storage[target], self.graph.name, target)

    def _collect_outputs(self, args: Sequence[Any], storage: dict[str, Any],
                         host_outputs: dict[str, torch.Tensor], blocks: dict[str, Any]) -> list[Any]:
        outputs: list[Any] = []
        pending: list[cl.Event] = []
        for position, out in enumerate(self.graph.outputs):
            if out.buffer is None:
                outputs.append(None)
                continue
            shape = out.shape if out.shape is not None else self.graph.buffers[out.buffer].shape
            if out.buffer in self._input_positions:
                arg = args[self._input_positions[out.buffer]]
                outputs.append(arg if out.shape is None else arg.reshape(shape))
                continue
            buf = self.graph.buffers[out.buffer]
            dtype = IR_TO_TORCH[buf.dtype]
            if out.role is ir.OutputRole.DEVICE:
                outputs.append(DeviceTensor(blocks[out.buffer], self.runtime, shape, dtype, self.graph.name,
                                            out.buffer))
                continue
            if out.buffer in host_outputs:
                # Written by the kernels straight into host memory: make it coherent, copy nothing.
                sync_shared(self.runtime, storage[out.buffer], buf.nbytes, write=False)
                BUS.transfer(self.graph.name, "d2h", buf.nbytes, out.buffer, "output",
                             copied=not self.runtime.profile.unified_memory)
                outputs.append(own_tensor(host_outputs[out.buffer], tuple(shape)))
                continue
            if self.residency.deferring and not self.residency.zero_copy and out.buffer in blocks \
                    and position not in self._restrided:
                # A gradient inside a TrainingStep: the optimizer graph reads the device copy and the
                # step clears the gradient after it, so its host copy is never filled in. (With
                # zero-copy, graphs read host memory itself: there the download is the copy they use.)
                tensor, _, owner = download_owned(self.runtime, None, shape, dtype, wait=False)
                poison(tensor)
                self.residency.adopt(tensor, owner, blocks[out.buffer])
                outputs.append(tensor)
                continue
            tensor, event, owner = download_owned(self.runtime, storage[out.buffer], shape, dtype, wait=False)
            BUS.transfer(self.graph.name, "d2h", buf.nbytes, out.buffer, "output", event=event)
            if event is not None:
                pending.append(event)
            if out.buffer in blocks:  # storage of its own: it stays on the device as the tensor's copy
                self.residency.adopt(tensor, owner, blocks[out.buffer])
            outputs.append(tensor)
        if pending or host_outputs:
            # The host waits for this call's results: the index error record is read in the same
            # wait (only if a checking kernel ran since it was last read clean), so an index out of
            # range in this call or an earlier one raises here instead of returning invalid values.
            read = self.runtime.index_errors.enqueue_read(self.runtime.queue)
            if read is not None:
                pending.append(read)
        if pending:
            cl.wait_for_events(pending)
        if pending or host_outputs:
            self.runtime.index_errors.raise_if_set(self.runtime.queue)
        return outputs


def restride(outputs: list[Any], strides_of: dict[int, tuple[int, ...]]) -> dict[int, torch.Tensor]:
    """Replace each output at a position of ``strides_of`` (downloaded: a host tensor with current
    values) by a host copy with those strides; returns, by position, the tensors replaced."""
    replaced = {}
    for position, strides in strides_of.items():
        value = outputs[position]
        if isinstance(value, torch.Tensor) and value.stride() != strides:
            replaced[position] = value
            outputs[position] = torch.empty_strided(value.shape, strides, dtype=value.dtype).copy_(value)
    return replaced


def check_input(graph: ir.Graph, name: str, value: Any) -> None:
    """Refuse an argument for input ``name`` that is not a tensor of the shape and dtype compiled for."""
    buf = graph.buffers[name]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{graph.name}: input {name} expected a tensor, got {type(value).__name__}")
    if tuple(value.shape) != buf.shape or value.dtype != IR_TO_TORCH[buf.dtype]:
        raise ValueError(
            f"{graph.name}: input {name} was compiled for {IR_TO_TORCH[buf.dtype]}{list(buf.shape)}, "
            f"got {value.dtype}{list(value.shape)}"
        )


def draw_random_seeds(graph: ir.Graph) -> list[torch.Tensor]:
    """A seed for each of the graph's random ops, from torch's default generator: torch.manual_seed(n)
    makes every random op repeat."""
    return [torch.randint(0, 2**62, (), dtype=torch.int64) for _ in graph.random_seeds]


def run_host_step(runtime: DeviceRuntime, graph: ir.Graph, step: HostStep, storage: dict[str, Any]) -> None:
    """An op run on the host by request (``fallback='host'``): its inputs read back, its outputs
    written to their device buffers (blocking: the host op ran between two launches)."""
    node = step.node
    runtime.queue.finish()
    inputs = []
    for view in node.inputs:
        buf = graph.buffers[view.buffer]
        tensor, _ = download(runtime, storage[view.buffer], buf.shape, IR_TO_TORCH[buf.dtype])
        BUS.transfer(graph.name, "d2h", buf.nbytes, view.buffer, "host_fallback")
        inputs.append(tensor)
    results = node.run(*inputs)
    tensors = [r for r in results if r is not None]
    for name, tensor in zip(node.outputs, tensors, strict=True):
        buf = graph.buffers[name]
        if buf.nbytes:
            cl.enqueue_copy(runtime.queue, storage[name], host_array(tensor.to(IR_TO_TORCH[buf.dtype])),
                            is_blocking=True)
        BUS.transfer(graph.name, "h2d", buf.nbytes, name, "host_fallback")
    if BUS.active:
        for o in node.origins:
            BUS.host_op(HostOpRecord(graph.name, node.target, o.node))

