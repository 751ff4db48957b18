"""Training from an exported step (:mod:`torch_adreno.export`) without PyTorch.

    runner = StepRunner.load("step.onnx")          # builds the embedded kernels on an OpenCL device
    loss = runner.step(x, y)                       # numpy batch in, loss out; state stays on the device
    runner.save_state("trained.npz")               # or .onnx: the same model with the trained state

Imports only numpy, pyopencl and onnx (and this package's ``format``). The step is the file's
launch list: each kernel node's OpenCL source built with its program's options, bound once to the
buffers its ``buffers`` attribute names (internal memory in the slots of the file's memory plan,
state and batch in buffers of their own), then enqueued in the file's order every step, as the
in-PyTorch replay does, so the losses are the replay's bit for bit on the same device.

With ``fill_uninitialized_memory`` (an argument, else the environment variable
``TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY``), the fills the file lists (metadata ``fills``) are
enqueued before their operations: each internal identity's bytes set to the fill pattern
(:data:`~torch_adreno.runner.format.FILL_PATTERN`: NaN for every float dtype, an index out of
range for every integer one) before its first write, so that a kernel reading memory nothing
wrote gives NaN or an index error instead of stale values; a correct step's losses are the same
bits either way.

Files it cannot run are refused with :class:`UnsupportedStepFile` naming what is missing: another
producer or format version, a node or attribute it does not know, a device without the
work-group sizes, memory or extensions the kernels need; a file whose tensors, kernel sources or
operations differ from the SHA-256 digests its export recorded with :class:`DamagedStepFile`
(:mod:`torch_adreno.runner.integrity`), before any of it is built or uploaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pyopencl as cl
from onnx import numpy_helper

from torch_adreno.runner import format as fmt
from torch_adreno.runner.format import UnsupportedStepFile
from torch_adreno.runner.integrity import DamagedStepFile, seal, verify

__all__ = ["DamagedStepFile", "StepRunner", "UnsupportedStepFile", "choose_device"]

#: Standard ops the export writes into the main graph around the kernels (views of inputs and outputs).
PLUMBING_OPS = frozenset({"Reshape", "Slice", "Gather", "Constant"})


@dataclass(frozen=True)
class Launch:
    name: str
    source: str
    options: tuple[str, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    buffers: tuple[int, ...]
    #: Takes the index error record and a token after ``buffers`` (format.KERNEL_ATTRIBUTES).
    index_checks: bool = False
    #: OpenCL extensions the kernel enables (the export writes them as data: no source is parsed).
    extensions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Copy:
    destination: int
    source: int
    nbytes: int


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper_value(a) for a in node.attribute}


def helper_value(attribute: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value


def read_step(model: onnx.ModelProto, origin: str = "the model") -> tuple[dict[str, Any], list[Launch | Copy]]:
    """The memory plan and the operations of an exported step; refuses what it cannot run, and a
    damaged file (:class:`DamagedStepFile`: its integrity record does not match)."""
    if model.producer_name != fmt.PRODUCER:
        producer = model.producer_name or "an unnamed producer"
        raise UnsupportedStepFile(f"{origin} was made by {producer}, not by torch_adreno's export: the runner runs only "
                                  "training steps exported with TrainingStep.export / `python -m torch_adreno export`")
    props = {p.key: p.value for p in model.metadata_props}
    version = props.get(fmt.FORMAT_KEY)
    if version != str(fmt.FORMAT_VERSION) or fmt.PLAN_KEY not in props:
        raise UnsupportedStepFile(f"{origin} has step format {version or '(none)'}; this runner reads format "
                                  f"{fmt.FORMAT_VERSION} (metadata {fmt.FORMAT_KEY} and {fmt.PLAN_KEY}): export it again")
    verify(model, origin)  # before anything of the file is parsed or built
    try:
        plan = json.loads(props[fmt.PLAN_KEY])
    except ValueError as err:
        raise UnsupportedStepFile(f"the step plan of {origin} is not JSON ({err}): export it again") from None
    functions = {f.name for f in model.functions if f.domain == fmt.DOMAIN}
    operations: list[Launch | Copy] = []
    for node in model.graph.node:
        where = f"node {node.name or node.op_type} of {origin}"
        if node.domain in ("", "ai.onnx"):
            if node.op_type not in PLUMBING_OPS:
                raise UnsupportedStepFile(f"{where} is a standard {node.op_type} between kernels; the runner runs "
                                          f"kernels and copies only (and {', '.join(sorted(PLUMBING_OPS))} around them)")
            continue
        if node.domain != fmt.DOMAIN:
            raise UnsupportedStepFile(f"{where} is an op of domain {node.domain!r}; the runner knows {fmt.DOMAIN!r} only")
        attributes = _attributes(node)
        expected = fmt.COPY_ATTRIBUTES if node.op_type == fmt.COPY_OP else fmt.KERNEL_ATTRIBUTES
        unknown = sorted(set(attributes) - set(expected))
        missing = sorted(set(expected) - set(attributes))
        if unknown or missing:
            raise UnsupportedStepFile(
                f"{where} has " + "; ".join(part for part in (
                    f"attributes this runner does not know: {', '.join(unknown)}" if unknown else "",
                    f"no attribute {', '.join(missing)}" if missing else "") if part)
                + f" (a kernel node carries exactly: {', '.join(expected)}); a newer export? update torch_adreno")
        if node.op_type not in functions:
            raise UnsupportedStepFile(f"{where} calls {node.op_type}, which the file defines no function for")
        if node.op_type == fmt.COPY_OP:
            operations.append(Copy(int(attributes["destination"]), int(attributes["source"]), int(attributes["nbytes"])))
        else:
            operations.append(Launch(attributes["kernel_name"], attributes["opencl_source"],
                                     tuple(o for o in attributes["build_options"] if o),
                                     tuple(attributes["global_size"]), tuple(attributes["local_size"]),
                                     tuple(attributes["buffers"]), bool(attributes["index_checks"]),
                                     tuple(e for e in attributes["extensions"] if e)))
    return plan, operations


def choose_device(spec: str | int | None = None) -> cl.Device:
    """An OpenCL device: by index into all devices, by a substring of its name (or its platform's),
    or, when ``spec`` is None, as ``TORCH_ADRENO_DEVICE`` says, else the first GPU, else the first
    device (the rule torch_adreno's backend follows)."""
    if spec is None:
        spec = os.environ.get("TORCH_ADRENO_DEVICE", "").strip() or None
    devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    if not devices:
        raise UnsupportedStepFile("no OpenCL device found (install a driver, or PoCL for the CPU)")
    if spec is None:
        gpus = [d for d in devices if d.type & cl.device_type.GPU]
        return (gpus or devices)[0]
    if isinstance(spec, int) or str(spec).isdigit():
        index = int(spec)
        if index >= len(devices):
            raise UnsupportedStepFile(f"device index {index}: there are {len(devices)} OpenCL devices")
        return devices[index]
    # Names as torch_adreno's backend labels devices ("platform: device"), or platform and name.
    wanted = str(spec).strip().lower()
    named = [d for d in devices if wanted in f"{d.platform.name.strip()}: {d.name.strip()}".lower()
             or wanted in f"{d.platform.name} {d.name}".lower()]
    if not named:
        raise UnsupportedStepFile(f"no OpenCL device named like {spec!r}; devices: {', '.join(d.name for d in devices)}")
    return named[0]


def check_device(device: cl.Device, plan: dict[str, Any], operations: Sequence[Launch | Copy]) -> None:
    """Refuse a device that lacks what the kernels need, naming it."""
    problems: list[str] = []
    extensions = set(device.extensions.split())
    max_sizes = list(device.max_work_item_sizes)
    for op in operations:
        if not isinstance(op, Launch):
            continue
        items = int(np.prod(op.local_size))
        if items > device.max_work_group_size:
            problems.append(f"kernel {op.name} needs work-groups of {items} items (device: at most "
                            f"{device.max_work_group_size})")
        for dim, (size, limit) in enumerate(zip(op.local_size, max_sizes, strict=False)):
            if size > limit:
                problems.append(f"kernel {op.name} needs {size} work-items in dimension {dim} (device: {limit})")
        for extension in op.extensions:
            if extension not in extensions:
                problems.append(f"kernel {op.name} needs the OpenCL extension {extension}")
    largest = max([*plan["slots"], *(i["nbytes"] for i in plan["identities"])], default=0)
    if largest > device.max_mem_alloc_size:
        problems.append(f"a buffer of {largest} bytes (device allocations: at most {device.max_mem_alloc_size})")
    if problems:
        raise UnsupportedStepFile(f"device {device.name.strip()} cannot run this step: " + "; ".join(dict.fromkeys(problems)))


class StepRunner:
    """An exported training step bound to one OpenCL device (see the module docstring)."""

    def __init__(self, model: onnx.ModelProto, device: cl.Device | None = None, origin: str = "the model",
                 fill_uninitialized_memory: bool | None = None) -> None:
        """``fill_uninitialized_memory``: fill memory before its first write (see the module
        docstring); None: as the environment variable ``TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY`` says."""
        self.model = model
        self.plan, self.operations = read_step(model, origin)
        if fill_uninitialized_memory is None:
            try:
                fill_uninitialized_memory = fmt.fill_requested()
            except ValueError as err:
                raise UnsupportedStepFile(str(err)) from None
        self.fill_uninitialized_memory = fill_uninitialized_memory
        self.device = device if device is not None else choose_device()
        check_device(self.device, self.plan, self.operations)
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context)
        initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        flags = cl.mem_flags
        slots = [cl.Buffer(self.context, flags.READ_WRITE, max(int(n), 1)) for n in self.plan["slots"]]
        self._buffers: dict[int, cl.Buffer] = {}
        #: name -> (identity, shape, dtype) of every state tensor (an input with an initial value).
        self.state_layout: dict[str, tuple[int, tuple[int, ...], np.dtype]] = {}
        self._batch: list[dict[str, Any]] = []
        self._predict_batch: list[dict[str, Any]] = []
        for entry in self.plan["identities"]:
            index, kind = int(entry["index"]), entry["kind"]
            if kind == "internal":
                if entry.get("slot") is not None:
                    self._buffers[index] = slots[int(entry["slot"])]
            elif kind == "persistent":
                name = entry["input"]
                if name not in initial:
                    raise UnsupportedStepFile(f"{origin} has no initial value for state input {name}")
                array = np.array(initial[name], order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
                self._buffers[index] = cl.Buffer(self.context, flags.READ_WRITE | flags.COPY_HOST_PTR,
                                                 hostbuf=array) if array.nbytes else cl.Buffer(self.context, flags.READ_WRITE, 1)
                self.state_layout[name] = (index, tuple(array.shape), array.dtype)
            elif kind == "batch":
                self._buffers[index] = cl.Buffer(self.context, flags.READ_WRITE, max(int(entry["nbytes"]), 1))
                (self._predict_batch if entry.get("program") == "predict" else self._batch).append(entry)
            else:
                raise UnsupportedStepFile(f"{origin} has memory of kind {kind!r}, which this runner cannot provide")
        self.batch_inputs = self.plan["batch"]
        self._programs: dict[tuple[str, tuple[str, ...]], cl.Program] = {}
        enqueue: list[Any] = []
        # Kernels indexing by tensor values check each index on the device: the first bad one is
        # recorded here (token, site, value) and read with the step's result.
        self._index_record = cl.Buffer(self.context, flags.READ_WRITE | flags.COPY_HOST_PTR,
                                       hostbuf=np.zeros(4, np.int32))
        self._checking_launches: list[str] = []
        fills = self._fills(origin, {int(e["index"]): e for e in self.plan["identities"]}, slots) \
            if fill_uninitialized_memory else {}
        # Per operation, the position of its first enqueue (the fills before it count as its own).
        starts = []
        for position, op in enumerate(self.operations):
            starts.append(len(enqueue))
            for buffer, offset, nbytes, pattern in fills.get(position, ()):
                enqueue.append((cl.enqueue_fill_buffer, (buffer, np.frombuffer(pattern, np.uint8), offset, nbytes), {}))
            if isinstance(op, Copy):
                enqueue.append((cl.enqueue_copy, (self._buffer(op.destination), self._buffer(op.source)),
                                      {"byte_count": op.nbytes}))
                continue
            kernel = cl.Kernel(self._program(op), op.name)
            for position, identity in enumerate(op.buffers):
                kernel.set_arg(position, self._buffer(identity))
            if op.index_checks:  # the record and this launch's token (1-based: 0 means "no error")
                self._checking_launches.append(op.name)
                kernel.set_arg(len(op.buffers), self._index_record)
                kernel.set_arg(len(op.buffers) + 1, np.int32(len(self._checking_launches)))
            enqueue.append((cl.enqueue_nd_range_kernel, (kernel, op.global_size, op.local_size), {}))
        # The prediction (the model's eval-mode forward), when the file holds one: its last operations.
        predict = self.plan.get("predict")
        count = int(predict["operations"]) if predict else 0
        split = starts[len(starts) - count] if count else len(enqueue)
        self._enqueue, self._predict = enqueue[:split], enqueue[split:]
        loss = self.plan["loss"]
        self._loss = self._output(loss)
        self._logits = self._output(predict["output"]) if predict else None

    def _fills(self, origin: str, identities: dict[int, dict[str, Any]], slots: list[cl.Buffer],
               ) -> dict[int, list[tuple[cl.Buffer, int, int, bytes]]]:
        """The file's fills as (buffer, offset, bytes, pattern) by the operation they precede;
        refused where the file lists none or one leaves its identity's slot."""
        if fmt.FILLS_KEY not in self.plan:
            raise UnsupportedStepFile(f"{origin} lists no fills (metadata {fmt.PLAN_KEY} has no {fmt.FILLS_KEY!r}): "
                                      "export the step again to run it with fill_uninitialized_memory")
        by_operation: dict[int, list[tuple[cl.Buffer, int, int, bytes]]] = {}
        for entry in self.plan[fmt.FILLS_KEY]:
            before, index, offset, nbytes = (int(v) for v in entry)
            identity = identities.get(index, {})
            slot = identity.get("slot")
            if identity.get("kind") != "internal" or slot is None or not 0 <= before < len(self.operations) \
                    or offset < 0 or offset % 2 or nbytes < 0 or offset + nbytes > int(self.plan["slots"][int(slot)]):
                raise UnsupportedStepFile(f"{origin}: fill {entry} is not inside an internal identity's slot before "
                                          "an operation of the file: a corrupted file? export the step again")
            by_operation.setdefault(before, []).extend(
                (slots[int(slot)], start, size, pattern) for start, size, pattern in fmt.fill_commands(offset, nbytes))
        return by_operation

    def _output(self, spec: dict[str, Any]) -> tuple[cl.Buffer, tuple[int, ...], np.dtype]:
        return self._buffer(int(spec["identity"])), tuple(spec["shape"]), np.dtype(spec["dtype"])

    @classmethod
    def load(cls, path: str | Path, device: cl.Device | None = None,
             fill_uninitialized_memory: bool | None = None) -> StepRunner:
        path = Path(path)
        try:
            model = onnx.load(str(path))
        except Exception as err:
            raise UnsupportedStepFile(f"{path} is not an ONNX model: {err}") from None
        return cls(model, device, str(path), fill_uninitialized_memory)

    def _buffer(self, identity: int) -> cl.Buffer:
        buffer = self._buffers.get(identity)
        if buffer is None:
            raise UnsupportedStepFile(f"an operation uses memory identity {identity}, which the file's plan does not place")
        return buffer

    def _program(self, launch: Launch) -> cl.Program:
        key = (launch.source, launch.options)
        if key not in self._programs:
            try:
                self._programs[key] = cl.Program(self.context, launch.source).build(options=list(launch.options))
            except cl.RuntimeError as err:
                raise UnsupportedStepFile(f"kernel {launch.name} does not build on {self.device.name.strip()}: {err}") from None
        return self._programs[key]

    def step(self, *batch: np.ndarray) -> float:
        """One training step on ``batch`` (arrays in the order of the step's batch inputs); returns the loss."""
        if len(batch) != len(self.batch_inputs):
            raise ValueError(f"the step takes {len(self.batch_inputs)} batch arrays, got {len(batch)}")
        return float(self._run(batch, self._batch, self._enqueue, self._loss))

    @property
    def can_predict(self) -> bool:
        return self._logits is not None

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The model's output in eval mode on ``x`` (batch input 0's geometry), with the current state."""
        if self._logits is None:
            raise UnsupportedStepFile("this file holds no prediction: export it with predict= (the CLI always does)")
        return self._run((x,), self._predict_batch, self._predict, self._logits)

    def _run(self, batch: Sequence[np.ndarray], uploads: list[dict[str, Any]], enqueue: list[Any],
             output: tuple[cl.Buffer, tuple[int, ...], np.dtype]) -> np.ndarray:
        arrays = {}
        for spec, array in zip(self.batch_inputs, batch, strict=False):
            array = np.asarray(array)
            if list(array.shape) != spec["shape"] or array.dtype != np.dtype(spec["dtype"]):
                raise ValueError(f"{spec['input']}: the step was exported for {spec['dtype']}{spec['shape']}, "
                                 f"got {array.dtype}{list(array.shape)}")
            arrays[int(spec["position"])] = np.ascontiguousarray(array)
        keep = []
        for entry in uploads:
            array = arrays[int(entry["position"])]
            if entry.get("view") is not None:
                shape, stride, offset = entry["view"]
                flat = array.reshape(-1)
                index = np.lib.stride_tricks.as_strided(np.arange(flat.size, dtype=np.int64), shape,
                                                        [s * 8 for s in stride]) + offset
                array = np.ascontiguousarray(flat[index])
            keep.append(array)
            cl.enqueue_copy(self.queue, self._buffers[int(entry["index"])], array, is_blocking=False)
        for function, args, kwargs in enqueue:
            function(self.queue, *args, **kwargs)
        buffer, shape, dtype = output
        result = np.empty(shape, dtype=dtype)
        cl.enqueue_copy(self.queue, result, buffer, is_blocking=True)
        del keep  # in use until the blocking read above
        if self._checking_launches:
            self._raise_on_index_error()
        return result

    def _raise_on_index_error(self) -> None:
        record = np.empty(4, np.int32)
        cl.enqueue_copy(self.queue, record, self._index_record, is_blocking=True)
        if record[0] == 0:
            return
        cl.enqueue_copy(self.queue, self._index_record, np.zeros(4, np.int32), is_blocking=True)
        value = int(record[2].astype(np.int64) & 0xFFFFFFFF) | (int(record[3]) << 32)
        kernel = self._checking_launches[int(record[0]) - 1] if 0 < record[0] <= len(self._checking_launches) else "?"
        raise IndexError(f"kernel {kernel} read index {value} out of range (check site {int(record[1])}): a batch "
                         "value indexes past a dimension (e.g. a token id >= the vocabulary); that step's results "
                         "are invalid (its update was applied with the index replaced by 0)")

    def state(self) -> dict[str, np.ndarray]:
        """The current value of every state tensor, by its input name."""
        out = {}
        for name, (identity, shape, dtype) in self.state_layout.items():
            array = np.empty(shape, dtype=dtype)
            if array.nbytes:
                cl.enqueue_copy(self.queue, array, self._buffers[identity], is_blocking=True)
            out[name] = array
        return out

    def save_state(self, path: str | Path) -> None:
        """Write the state: ``.npz`` (parameters, buffers, optimizer state by name), or ``.onnx``
        (this step with the state as its initial values, to train on or load)."""
        path = Path(path)
        state = self.state()
        if path.suffix == ".npz":
            np.savez(path, **{k: v for k, v in state.items() if not k.startswith("captured.")})  # type: ignore[arg-type]
            return
        if path.suffix != ".onnx":
            raise ValueError(f"{path}: the state is written as .npz or .onnx")
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        for tensor in model.graph.initializer:
            if tensor.name in state:
                tensor.CopyFrom(numpy_helper.from_array(state[tensor.name], tensor.name))
        onnx.save(seal(model), str(path))
