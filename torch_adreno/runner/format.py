"""The layout of a training step exported as ONNX (:mod:`torch_adreno.export` writes it, the runner
reads it). Torch-free: the runner imports this module where PyTorch is not installed.

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
  inputs and outputs, and the loss.
"""

from __future__ import annotations

PRODUCER = "torch_adreno"
DOMAIN = "torch_adreno"
#: Version of this layout; a runner refuses other versions.
FORMAT_VERSION = 3
OPSET = 18
PLAN_KEY = "torch_adreno.step"
FORMAT_KEY = "torch_adreno.format"
COPY_OP = "copy"

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
                       # replaced by 0 and recorded there (torch_adreno/compiler/codegen/index_check.cl)
    "extensions",      # the OpenCL extensions the kernel enables (the device must have them); [""]: none
)
COPY_ATTRIBUTES = ("destination", "source", "nbytes")

#: ONNX element types (TensorProto enum values) -> numpy dtype names; the only ones a file uses.
ELEMENT_TYPES = {1: "float32", 7: "int64", 6: "int32", 9: "bool", 2: "uint8"}
