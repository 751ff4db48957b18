"""The layout of a training step exported as ONNX: the step format's one home.

:mod:`torch_adreno.export` writes it (:mod:`torch_adreno.export.onnx_writer`); its readers are
the Python runner (:mod:`torch_adreno.runner`), the native runtime (``native/src/onnx_reader.c``,
``native/src/plan_memory.c``: ``torch-adreno-step``), and a remote device, whose step server is
the native runtime's (:mod:`torch_adreno.remote` sends it the file). Torch-free: the runner
imports this module where PyTorch is not installed. A change of the layout changes
:data:`FORMAT_VERSION`, and every reader with it.

A file holds one ONNX model of one whole training step:

- graph inputs: the batch arguments (``batch_0``, ``batch_1``, ...) and every persistent tensor
  the step reads (parameters, buffers, optimizer state, a tensor learning rate ``lr``), the
  latter with initializers (their values at export); graph outputs: ``loss`` and, for each
  persistent tensor the step updates, ``<name>.new``;
- one node per device operation of the step, in launch order: a kernel launch (op type = the
  kernel's name, domain :data:`DOMAIN`) calling a model-local function whose body is the standard
  ONNX ops computing what the kernel fused, or a buffer copy (op type :data:`COPY_OP`); values
  between them are flat (1-D) tensors, one per value a memory identity takes;
- :data:`KERNEL_ATTRIBUTES` on each kernel node, :data:`COPY_ATTRIBUTES` on each copy node;
- model metadata :data:`PLAN_KEY`: JSON with the memory identities (what each buffer holds, its
  bytes, its slot in the step's memory plan), the slots' bytes, the batch inputs, the state
  inputs and outputs, and the loss; and its ``fills``: ``[before, identity, offset, nbytes]``
  each, the bytes of an internal identity that a runner filled with :data:`FILL_PATTERN` (with
  :data:`FILL_VARIABLE` set, or its own flag) right before operation ``before`` (an index into the
  file's kernel and copy nodes), in operation order: every identity before its first use, and an
  identity's bytes again where a graph's slot begins holding another buffer (see
  :mod:`torch_adreno.kernels.fills`). Ignored unless filling is asked for;
- the plan's JSON, key by key: ``identities``, one entry per memory identity, ``{index, kind,
  nbytes, label}`` with, by ``kind``: ``persistent`` ``input`` (the graph input), ``shape``,
  ``output`` (``<input>.new``, or null where the step does not update it); ``batch``
  ``position`` (the batch argument) and ``view`` (null: the whole argument; else ``[shape,
  strides, offset]`` in elements of the argument); ``internal`` ``slot`` (index into ``slots``,
  null: no memory of the plan); the prediction's own identities add ``"program": "predict"``.
  ``slots``: bytes of each slot. ``batch``: ``{input, position, shape, dtype}`` per batch input.
  ``loss``: ``{identity, dtype, shape}``. :data:`FILLS_KEY`: as above. ``predict`` (only with a
  prediction): ``{operations, output}``, ``operations`` the number of the file's last operations
  that compute it, ``output`` ``{identity, dtype, shape}`` of ``logits``;
- model metadata ``torch_adreno.integrity``: SHA-256 digests of every initializer's values, of
  the kernel sources and of the operations and plan (:mod:`torch_adreno.runner.integrity`), which
  every runner checks before it uses the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class UnsupportedStepFile(ValueError):
    """A file the runner cannot run, or a device it cannot run it on; the message says what is missing."""


PRODUCER = "torch_adreno"
DOMAIN = "torch_adreno"
#: Version of this layout; a runner refuses other versions.
FORMAT_VERSION = 4
OPSET = 18
PLAN_KEY = "torch_adreno.step"
FORMAT_KEY = "torch_adreno.format"
COPY_OP = "copy"
#: The plan's list of fills (absent in files exported before fills were listed: a runner asked to
#: fill refuses those).
FILLS_KEY = "fills"
#: The environment variable (and option name, upper-cased) that turns filling on in a runner, as
#: the backend's ``fill_uninitialized_memory`` option does.
FILL_VARIABLE = "TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY"

#: What memory is filled with before its first write: the 16-bit word 0x7FFF, little-endian,
#: repeated. One pattern for every dtype (a slot holds values of several dtypes in turn, and a
#: runner knows no dtypes): read as float32 it is 0x7FFF7FFF, as float16 and bfloat16 0x7FFF, all
#: quiet NaNs (every exponent bit set, the top mantissa bit set), so any arithmetic on it stays NaN;
#: as int32 0x7FFF7FFF and as int64 0x7FFF7FFF7FFF7FFF, positive and far above any dimension, so
#: an index read from it fails the device's index checks (a negative sentinel such as -1 would
#: wrap to the last element where indices wrap) and a count or offset from it is absurd; as bool
#: bytes 0xFF and 0x7F, neither 0 nor 1; as uint8 255 and 127.
FILL_PATTERN = b"\xff\x7f"


def fill_commands(offset: int, nbytes: int) -> list[tuple[int, int, bytes]]:
    """The ``clEnqueueFillBuffer`` calls, as (offset, bytes, pattern), that fill ``nbytes`` from
    ``offset`` (even: the pattern's bytes fall at the same positions whatever the region) with
    :data:`FILL_PATTERN`: one call, and a second of the single byte 0xFF for an odd last byte
    (OpenCL fills whole patterns only)."""
    if offset % len(FILL_PATTERN):
        raise ValueError(f"a fill starts at an even byte offset, got {offset}")
    whole = nbytes - nbytes % len(FILL_PATTERN)
    commands = [(offset, whole, FILL_PATTERN)] if whole else []
    if nbytes > whole:
        commands.append((offset + whole, nbytes - whole, FILL_PATTERN[:1]))
    return commands


def fill_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether :data:`FILL_VARIABLE` asks for filling (``1``/``true``/``yes``/``on``; unset,
    empty, ``0``/``false``/``no``/``off``: no); a ValueError for any other value."""
    value = (os.environ if environ is None else environ).get(FILL_VARIABLE, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"environment variable {FILL_VARIABLE}: must be 1 or 0 (true/false, yes/no, on/off), got {value!r}")

#: Attributes of a kernel node, each required, none other allowed.
KERNEL_ATTRIBUTES = (
    "kernel_name",     # the function name in the OpenCL source (the kernel's symbol; the node's name
                       # and op type carry the kernel's name in torch_adreno, with its graph's number)
    "opencl_source",   # a whole OpenCL program holding the kernel (helpers and -D defines included)
    "build_options",   # options of the program build
    "global_size",
    "local_size",
    "buffers",         # the memory identity bound to each kernel argument, in argument order
    "parameters",      # the IR buffer name of each argument (documentation: Netron shows it)
    "fx_nodes",        # the FX nodes the kernel computes
    "graph",           # the compiled graph the kernel belongs to
    "index_checks",    # 1: after ``buffers`` the kernel takes an index error record (4 x int32, zeroed)
                       # and an int32 token >= 1 naming the launch; a value indexing out of range is
                       # replaced by 0 and recorded there (torch_adreno/kernels/index_check.cl)
    "extensions",      # the OpenCL extensions the kernel enables (the device must have them); [""]: none
)
COPY_ATTRIBUTES = ("destination", "source", "nbytes")

#: ONNX element types (TensorProto enum values) -> numpy dtype names; the only ones a file uses.
ELEMENT_TYPES = {1: "float32", 7: "int64", 6: "int32", 9: "bool", 2: "uint8"}
