"""Recording the device work of one training step, so that it can be replayed (see :mod:`.replay`).

While a :class:`StepRecorder` is active (``with recorder:``, on the thread that runs the step),
every :class:`~torch_adreno.runtime.executable.Executable` call on its device reports, after its
launches, what it enqueued and over which buffers: the recording is the step's whole device work
as one list of operations (kernel launches and buffer-to-buffer copies) over *memory identities*.

A memory identity is what a buffer holds across the step, whatever OpenCL object a graph bound it
through. Each is one of:

- ``internal``: created during the step (an arena slot, a saved activation, a gradient, the loss,
  scratch): written before it is read, dead after its last use, so a replay may place it anywhere;
- ``batch``: the memory of a batch tensor (or a view of one) the step was called with;
- ``seed``: a random-number seed a graph drew for this call (a replay draws fresh ones);
- ``persistent``: a host tensor that outlives the step (parameter, buffer, optimizer state,
  a tensor learning rate, the 16-bit copy of a frozen parameter): the replay binds the very buffer
  the residency holds for it. A frozen copy names its source (:attr:`MemoryIdentity.copy_of`):
  the replay is valid only while the source is unchanged.

Several OpenCL buffers may stand for one identity: with zero-copy, a gradient written by the
backward into host memory is bound by the optimizer through another buffer over that memory.

Invariant: a recording is complete or marked :attr:`StepRecorder.unsupported` with the reason (a
graph ran an op on the host, a device tensor came from outside the step, a value the step made
on the host reached a graph, ...); an unsupported recording is never replayed.

Values made on the host during the step are what a replay cannot see: it reruns the graphs'
device work only. An input whose memory no graph of the step wrote is taken for persistent state
(the replay binds the buffer the capture bound), so one that is really a per-step value must be
told apart: a host copy a graph call returned in place of its output (an output in eager's
strides) stands for that output, whose values it holds, as long as the host left it unchanged;
a parameter's gradient that is neither (autograd's own copy, a hook's result) makes the
recording unsupported.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import pyopencl as cl
import torch

from torch_adreno.kernels.fills import fill_schedule, step_runs
from torch_adreno.kernels.program import HostStep
from torch_adreno.memory import StorageKind
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.frozen import FROZEN_COPIES
from torch_adreno.runtime.graph_calls import GraphCall, observing


class IdentityKind(str, enum.Enum):
    """What a memory identity is (see the module docstring); its value is how an export names it."""

    INTERNAL = "internal"
    BATCH = "batch"
    SEED = "seed"
    PERSISTENT = "persistent"

    def __str__(self) -> str:
        return self.value


INTERNAL, BATCH, SEED, PERSISTENT = IdentityKind.INTERNAL, IdentityKind.BATCH, IdentityKind.SEED, IdentityKind.PERSISTENT


@dataclass
class MemoryIdentity:
    """What one or more bound buffers hold during the step (see the module docstring)."""

    index: int
    kind: IdentityKind
    nbytes: int
    #: The buffer as the capture bound it (persistent: the residency's buffer, replayed as is).
    buffer: cl.Buffer
    #: Where it came from, for messages: "<graph>.<buffer>".
    label: str
    #: Persistent: the host tensor; batch: the view of the batch tensor that was bound.
    tensor: torch.Tensor | None = None
    #: Batch: which argument of the step, and the view's geometry in that argument's storage.
    batch_position: int = -1
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
    #: Internal: an arena slot of a graph (allocated for the graph's lifetime on the full path).
    arena: bool = False
    #: Persistent: the frozen tensor this one is the 16-bit copy of (:mod:`torch_adreno.runtime.frozen`),
    #: made at the full path's call; a replay must not outlive a change of it.
    copy_of: torch.Tensor | None = None


@dataclass(frozen=True)
class RecordedLaunch:
    graph: str
    kernel: cl.Kernel
    source: Any  # KernelSource
    #: The memory identity bound to each kernel argument, in argument order.
    args: tuple[int, ...]


@dataclass(frozen=True)
class RecordedCopy:
    """A device-side copy: the new value of an updated input into the input's own memory."""

    graph: str
    destination: int
    source: int
    nbytes: int


@dataclass(frozen=True)
class RecordedFill:
    """Where ``fill_uninitialized_memory`` fills memory in a replay (and a runner): ``nbytes`` of
    identity ``identity`` from byte ``offset`` of it, right before operation ``before``. A graph
    call's fills (:func:`~torch_adreno.kernels.fills.fill_schedule`) at its launches: an
    internal identity is filled before its first use, and an arena slot's bytes again before each
    buffer the slot holds in turn; always inside the identity's lifetime and bytes."""

    before: int
    identity: int
    offset: int
    nbytes: int


@dataclass
class StepRecorder:
    """Collects what the Executable calls of one step enqueue (see the module docstring)."""

    runtime: DeviceRuntime
    batch: tuple[Any, ...]
    #: The parameters the step trains: their gradients are values of the step, never persistent.
    parameters: tuple[torch.Tensor, ...] = ()
    identities: list[MemoryIdentity] = field(default_factory=list)
    operations: list[RecordedLaunch | RecordedCopy] = field(default_factory=list)
    #: Persistent identities the step updates (parameters, optimizer state), with their tensors.
    updated: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    #: Seed identities in the order the graphs drew them (a replay draws in the same order).
    seeds: list[int] = field(default_factory=list)
    #: Where memory is filled when ``fill_uninitialized_memory`` is on, in operation order
    #: (recorded whether or not it is: an export lists them for its runners).
    fills: list[RecordedFill] = field(default_factory=list)
    #: Why this recording cannot be replayed (None: it can).
    unsupported: str | None = None
    graphs: list[str] = field(default_factory=list)
    #: The kernel program (IR graph, memory plan, kernels) of each graph that ran, by graph name:
    #: what an export (:mod:`torch_adreno.export`) translates the launches from.
    programs: dict[str, Any] = field(default_factory=dict)
    _by_buffer: dict[int, int] = field(default_factory=dict)
    _by_host_memory: dict[int, int] = field(default_factory=dict)
    #: The identity holding each output a graph returned, by the host address of the tensor.
    _outputs: dict[int, int] = field(default_factory=dict)
    _host_outputs: list[torch.Tensor] = field(default_factory=list)
    #: Host copies graph calls returned in place of outputs, by address: (the copy, its version
    #: when made, the output's identity).
    _host_copies: dict[int, tuple[torch.Tensor, int, int]] = field(default_factory=dict)
    _held_buffers: list[cl.Buffer] = field(default_factory=list)
    _observing: Any = None

    def __enter__(self) -> StepRecorder:
        self._observing = observing(self)
        self._observing.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._observing.__exit__(*exc)

    # -- identities --------------------------------------------------------------------------

    def _new(self, kind: IdentityKind, buffer: cl.Buffer, nbytes: int, label: str, **fields: Any) -> int:
        index = len(self.identities)
        self.identities.append(MemoryIdentity(index, kind, nbytes, buffer, label, **fields))
        self._map_buffer(buffer, index)
        return index

    def _map_buffer(self, buffer: cl.Buffer, index: int) -> None:
        """Buffers are told apart by their Python objects, each held while recording: an OpenCL
        handle (``int_ptr``) released during the step (a seed's buffer, freed with its tensor) may be
        handed to the next buffer made, which would then pass for the released one's memory (seen:
        a gradient taken for an 8-byte seed, written past it in every replay)."""
        self._by_buffer[id(buffer)] = index
        self._held_buffers.append(buffer)

    def _internal(self, buffer: cl.Buffer, label: str, host: torch.Tensor | None = None,
                  arena: bool = False) -> int:
        known = self._by_buffer.get(id(buffer))
        if known is not None:
            return known
        index = self._new(INTERNAL, buffer, buffer.size, label, arena=arena)
        if host is not None:
            self._by_host_memory[host.data_ptr()] = index
            # Alive while recording: its address must not be handed to a tensor made later in the
            # step (a random seed, say), which would then pass for this output's memory.
            self._host_outputs.append(host)
        return index

    def _batch_view(self, value: torch.Tensor) -> tuple[int, tuple[tuple[int, ...], tuple[int, ...], int]] | None:
        """Which batch argument ``value`` is a view of, and the view's geometry."""
        if value.numel() == 0:
            return None
        storage = value.untyped_storage().data_ptr()
        for position, tensor in enumerate(self.batch):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() == storage \
                    and tensor.dtype == value.dtype:
                return position, (tuple(value.shape), tuple(value.stride()), int(value.storage_offset()))
        return None

    def _input(self, graph: str, name: str, value: Any, buffer: cl.Buffer, is_seed: bool) -> int:
        known = self._by_buffer.get(id(buffer))
        label = f"{graph}.{name}"
        if known is not None:
            return known
        from torch_adreno.runtime.device_tensor import DeviceTensor

        if isinstance(value, DeviceTensor):
            self.unsupported = f"{label} is a device tensor made before the step"
            return self._new(INTERNAL, buffer, buffer.size, label)
        if is_seed:
            index = self._new(SEED, buffer, buffer.size, label)
            self.seeds.append(index)
            return index
        if value.numel() and value.data_ptr() in self._by_host_memory:
            # Host memory a graph of this step wrote (a zero-copy gradient), bound anew.
            index = self._by_host_memory[value.data_ptr()]
            self._map_buffer(buffer, index)
            return index
        copied = self._host_copies.get(value.data_ptr()) if value.numel() else None
        if copied is not None:
            copy, version, index = copied
            if copy is value and value._version == version:
                # Bound through its row-major elements: the output's own values.
                self._map_buffer(buffer, index)
                return index
            self.unsupported = f"{label} is a host copy of {self.identities[index].label} that the host changed"
        view = self._batch_view(value)
        if view is not None:
            return self._new(BATCH, buffer, value.numel() * value.element_size(), label, tensor=value,
                             batch_position=view[0], view=view[1])
        if self._is_gradient(value):
            self.unsupported = (f"{label}, a parameter's gradient ({list(value.shape)}), was made on the host during "
                                "the step, not by a graph: a replay cannot recompute it")
        return self._new(PERSISTENT, buffer, buffer.size, label, tensor=value, copy_of=FROZEN_COPIES.source_of(value))

    def _is_gradient(self, value: torch.Tensor) -> bool:
        if not value.numel():
            return False
        storage = value.untyped_storage().data_ptr()
        return any(p.grad is not None and p.grad.numel() and p.grad.untyped_storage().data_ptr() == storage
                   for p in self.parameters)

    # -- what an Executable call reports ----------------------------------------------------

    def graph_called(self, call: GraphCall) -> None:
        """What one graph call of the step enqueued (:class:`GraphCallObserver`)."""
        if call.runtime is not self.runtime:
            self.unsupported = f"{call.program.graph.name} ran on another device than the step's"
            return
        graph, plan, args, storage = call.program.graph, call.program.plan, call.args, call.storage
        if graph.float64_inputs:
            self.unsupported = (f"{graph.name} takes a Python float as an input ({', '.join(sorted(graph.float64_inputs))}), "
                                "a new value each call that a replay would not see")
        self.graphs.append(graph.name)
        self.programs[graph.name] = call.program
        first_seed = len(args) - len(graph.random_seeds)
        identity: dict[str, int] = {}
        for pos, name in enumerate(graph.inputs):
            if name is not None:
                identity[name] = self._input(graph.name, name, args[pos], storage[name], pos >= first_seed)
        for name, alloc in plan.allocations.items():
            if name in identity or name not in storage:
                continue
            if alloc.kind is StorageKind.INPUT_ALIAS:
                assert alloc.in_place_of is not None
                identity[name] = identity[alloc.in_place_of]
            else:
                identity[name] = self._internal(storage[name], f"{graph.name}.{name}", call.host_outputs.get(name),
                                                arena=alloc.kind is StorageKind.ARENA)
        for host_step in call.host_steps:
            self.unsupported = f"{graph.name} runs {host_step.node.target} on the host (fallback='host')"
        self._record_fills(call.program, identity)
        for kernel, source in call.launches:
            self.operations.append(RecordedLaunch(graph.name, kernel, source, tuple(identity[name] for name in source.params)))
        for target, value in graph.mutations.items():
            tensor = args[call.input_positions[target]]
            if plan.allocations[value].kind is not StorageKind.INPUT_ALIAS:
                nbytes = graph.buffers[value].nbytes
                if nbytes:
                    self.operations.append(RecordedCopy(graph.name, identity[target], identity[value], nbytes))
            kind = self.identities[identity[target]].kind
            if kind is PERSISTENT:
                self.updated.append((tensor, identity[target]))
            elif kind is not INTERNAL:  # memory made in the step (gradients clipped in place) is fine
                self.unsupported = f"{graph.name} updates {target} in place, a {kind} input of the step"
        for position, (out, value) in enumerate(zip(graph.outputs, call.outputs, strict=True)):
            if out.buffer is not None and isinstance(value, torch.Tensor) and value.numel():
                self._outputs[value.data_ptr()] = identity[out.buffer]
                if position in call.host_copies:
                    self._host_copies[value.data_ptr()] = (value, value._version, identity[out.buffer])
                    self._host_outputs.append(value)

    def _record_fills(self, program: Any, identity: dict[str, int]) -> None:
        """The fills of one graph call whose launches are about to be appended (see :class:`RecordedFill`)."""
        position = len(self.operations)
        for step, regions in zip(program.steps, fill_schedule(program), strict=True):
            if isinstance(step, HostStep):  # (such a recording is unsupported)
                continue
            self.fills.extend(RecordedFill(position, identity[r.buffer], r.offset, r.nbytes) for r in regions)
            position += step_runs(step)

    def watched_tensors(self) -> list[torch.Tensor]:
        """The host tensors a replay of this recording reads, directly or through a copy: each
        persistent identity's tensor, and the source of each frozen copy (what its guard watches)."""
        tensors = [i.tensor for i in self.identities if i.kind is PERSISTENT and i.tensor is not None]
        return tensors + [i.copy_of for i in self.identities if i.copy_of is not None]

    def output_identity(self, tensor: torch.Tensor) -> int | None:
        """The identity holding ``tensor``, an output some graph of the step returned."""
        return self._outputs.get(tensor.data_ptr()) if tensor.numel() else None


@dataclass(frozen=True)
class StepRecording:
    """What a finished recording says about the step, without the buffers of its internal memory
    (a replay keeps this; an export translates it). Identities keep their buffer only when
    persistent (the replay holds those anyway)."""

    identities: tuple[MemoryIdentity, ...]
    operations: tuple[RecordedLaunch | RecordedCopy, ...]
    updated: tuple[int, ...]
    seeds: tuple[int, ...]
    programs: dict[str, Any]
    loss: int
    #: Shape, strides, storage offset and dtype of each batch argument (None: not a tensor).
    batch: tuple[tuple[tuple[int, ...], tuple[int, ...], int, torch.dtype] | None, ...]
    #: Where ``fill_uninitialized_memory`` fills memory (:class:`RecordedFill`).
    fills: tuple[RecordedFill, ...] = ()


def recording_of(recorder: StepRecorder, loss: int) -> StepRecording:
    """``recorder``'s step as a :class:`StepRecording`, ``loss`` its loss identity."""
    identities = tuple(
        i if i.kind is PERSISTENT else MemoryIdentity(i.index, i.kind, i.nbytes, None, i.label,  # type: ignore[arg-type]
                                                     None, i.batch_position, i.view, i.arena)
        for i in recorder.identities)
    batch = tuple((tuple(t.shape), tuple(t.stride()), int(t.storage_offset()), t.dtype)
                  if isinstance(t, torch.Tensor) else None for t in recorder.batch)
    return StepRecording(identities, tuple(recorder.operations), tuple(i for _, i in recorder.updated),
                         tuple(recorder.seeds), dict(recorder.programs), loss, batch, tuple(recorder.fills))


__all__ = [
    "BATCH",
    "INTERNAL",
    "PERSISTENT",
    "SEED",
    "IdentityKind",
    "MemoryIdentity",
    "RecordedCopy",
    "RecordedFill",
    "RecordedLaunch",
    "StepRecorder",
    "StepRecording",
    "recording_of",
]

