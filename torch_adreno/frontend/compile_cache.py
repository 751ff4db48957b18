"""Compiled graphs kept in PyTorch's AOTAutograd cache, so that a second process skips tracing
and partitioning the joint graph and every stage of ours.

Without a cache a compile costs, per region, Dynamo's trace, AOTAutograd's joint trace and min-cut
partition, and our lowering, fusion, memory plan and rendering, around a second each for a small
model on a CPU. AOTAutograd has a disk cache keyed by Dynamo's graph and its inputs'
metadata; its *bundled* mode stores the compiled forward and backward themselves, for any backend
whose compilers return an ``OutputCode``. :class:`CompiledGraph` is that object for us: it holds the
:class:`~torch_adreno.kernels.KernelProgram` (picklable: IR, memory plan, kernel sources) and binds
it to the device (builds the kernels, from the program-binary cache when warm) at its first use.

Invariant: an entry is reused only when everything that decides its content matches: AOTAutograd's
key (Dynamo's graph code, input shapes/dtypes/strides, autograd and functorch settings, torch
version) plus :func:`cache_salt` (our options, the OpenCL device and driver, the kernel choices
made for it, and a hash of this package's source, so any edit of the compiler invalidates every entry).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from torch_adreno.config import Config
from torch_adreno.ir import OutputRole
from torch_adreno.kernels import HostStep, KernelChoices, KernelProgram
from torch_adreno.runtime import Executable, get_residency, get_runtime
from torch_adreno.runtime.binary_cache import device_identity
from torch_adreno.runtime.frozen import NO_FROZEN_COPIES, FrozenCopyInputs
from torch_adreno.targets.profiles import profile_for

log = logging.getLogger(__name__)

try:  # PyTorch's bundled AOTAutograd cache (torch >= 2.8); without it graphs are compiled each time.
    from torch._functorch._aot_autograd import autograd_cache
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
    from torch._inductor.output_code import OutputCode

    AVAILABLE = hasattr(torch._functorch.config, "bundled_autograd_cache")
except ImportError:  # pragma: no cover - depends on the installed torch
    AVAILABLE = False
    OutputCode = object  # type: ignore[assignment,misc]

#: Options that do not change a compiled graph (``debug_dir`` turns the cache off instead, so that
#: every compile writes its debug files).
_OPTIONS_OUTSIDE_KEY = ("debug_dir", "verify_replay")


def source_files() -> list[Path]:
    """The package's Python and OpenCL sources, every stage's (not this module's directory alone)."""
    return sorted(p for p in PACKAGE_ROOT.rglob("*") if p.suffix in (".py", ".cl"))


PACKAGE_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def source_hash() -> str:
    """sha256 over :func:`source_files` (path and bytes of each)."""
    root = PACKAGE_ROOT
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_salt(config: Config, choices: KernelChoices | None = None) -> str:
    """What besides Dynamo's graph decides a compiled graph: options, device+driver, our source and
    the code ``choices`` made for the device (default: the device's own). Keyed on the choices
    themselves, a graph compiled with one choice is never served where another is made (a test or
    benchmark that picks a GEMM template, ``adreno_backend(..., kernel_choices=...)``)."""
    runtime = get_runtime(config.device)
    residency = get_residency(runtime, config.zero_copy)
    options = {k: v for k, v in config.as_dict().items() if k not in _OPTIONS_OUTSIDE_KEY}
    profile = profile_for(runtime.profile, config.target)  # the target's limits decide the code
    choices = choices if choices is not None else KernelChoices.for_device(profile, config)
    return json.dumps({
        "options": options, "zero_copy": residency.zero_copy, "device": device_identity(runtime.device),
        "profile": repr(profile), "kernel_choices": choices.cache_key(), "source": source_hash(),
    }, sort_keys=True, default=str)


def cache_usable(config: Config) -> bool:
    return AVAILABLE and config.compile_cache and config.debug_dir is None


#: While our backend compiles: the cache salt of its options and the region being compiled (which
#: names graphs loaded from the cache). Per context, so a concurrent compile elsewhere (Inductor in
#: another thread) keeps PyTorch's own key.
_compiling: ContextVar[tuple[str, int] | None] = ContextVar("torch_adreno_compiling", default=None)


@functools.cache
def _install_key() -> None:
    """Route AOTAutograd's cache key through :func:`graph_key` while our backend compiles (once per
    process; everywhere else the key stays PyTorch's)."""
    upstream = autograd_cache.autograd_cache_key

    def key(*args: Any, **kwargs: Any) -> tuple[str, list[str]]:
        compiling = _compiling.get()
        if compiling is None:
            return upstream(*args, **kwargs)
        return graph_key(*args, **kwargs, salt=compiling[0])

    autograd_cache.autograd_cache_key = key


@contextmanager
def caching(gm: torch.fx.GraphModule, config: Config, region: int, choices: KernelChoices) -> Iterator[None]:
    """Around AOTAutograd's compile of ``gm`` with ``choices``: look it up in (and save it to) the
    bundled cache.

    The backward is compiled together with the forward (not lazily at its first call) because the
    entry is written once both exist, while the bundled mode is switched on.
    """
    if not cache_usable(config):
        yield
        return
    _install_key()
    token = _compiling.set((cache_salt(config, choices), region))
    try:
        with torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True):
            yield
    finally:
        _compiling.reset(token)


#: The settings of AOTAutograd's ``AOTConfig`` that its own cache key covers (the rest are compilers,
#: decompositions and ids, fixed by our backend or irrelevant to the result).
_AOT_CONFIG_KEY_FIELDS = ("num_params_buffers", "keep_inference_input_mutations", "is_export", "no_tangents",
                          "dynamic_shapes", "aot_autograd_arg_pos_to_source", "static_input_indices", "pre_dispatch")


def _tensor_key(value: torch.Tensor) -> list[Any]:
    return [type(value).__name__, list(value.shape), list(value.stride()), value.storage_offset(), str(value.dtype),
            str(value.device), str(value.layout), value.requires_grad, value.is_leaf, value.is_inference()]


def _input_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if any(not isinstance(s, int) for s in value.shape):
            raise BypassAOTAutogradCache("an input has a symbolic shape")
        return _tensor_key(value)
    if isinstance(value, int | float | bool | str | None):
        return [type(value).__name__, value]
    raise BypassAOTAutogradCache(f"an input of type {type(value).__name__} has no cache key")


def _module_key(gm: torch.fx.GraphModule, digest: Any) -> None:
    """Digest the graph's code, where its ops came from, and every attribute it reads (constant
    tensors by value)."""
    digest.update(gm.code.encode())
    for node in gm.graph.nodes:
        # Where each op came from (source line, module path): the kernels carry it into profiles,
        # so a graph compiled from other code must not be named after this one's.
        stack = node.meta.get("nn_module_stack") or {}
        digest.update(repr((node.meta.get("stack_trace"), [str(v[0]) for v in stack.values()])).encode())
        if node.op == "call_module":
            raise BypassAOTAutogradCache("the graph calls a submodule")
        if node.op != "get_attr":
            continue
        value = gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        digest.update(str(node.target).encode())
        if isinstance(value, torch.fx.GraphModule):
            _module_key(value, digest)
        elif isinstance(value, torch.Tensor) and not value.is_meta and type(value) is torch.Tensor:
            digest.update(json.dumps(_tensor_key(value)).encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        else:
            raise BypassAOTAutogradCache(f"the graph reads an attribute of type {type(value).__name__}")


def _alias_classes(inputs: Sequence[Any]) -> list[int | None]:
    """Per input, the position of the first tensor input sharing its storage (None: not a tensor)."""
    seen: list[StorageWeakRef] = []
    classes: list[int | None] = []
    for value in inputs:
        if not isinstance(value, torch.Tensor):
            classes.append(None)
            continue
        ref = StorageWeakRef(value.untyped_storage())
        match = next((i for i, other in enumerate(seen) if other == ref), None)
        if match is None:
            seen.append(ref)
            match = len(seen) - 1
        classes.append(match)
    return classes


def graph_key(mod: Any, example_inputs: Sequence[Any], aot_config: Any, compiler_config_extra: Any = None, *,
              salt: str) -> tuple[str, list[str]]:
    """The cache key of a Dynamo graph about to be compiled by us (stands in for AOTAutograd's own
    ``autograd_cache_key`` while we compile).

    Covers what AOTAutograd's key covers for graphs reaching this backend -- the graph's code and the
    constants it reads, each input's tensor metadata and which inputs share storage, AOTAutograd's
    settings (its config and the cacheable part of ``aot_config``), grad mode, autocast, the default
    dtype, deterministic algorithms and the torch build -- plus ``salt``. Graphs whose partition
    user code may change (saved-tensor hooks, custom joint passes) are not cached. Written here because the upstream key also hashes Inductor's state,
    which imports and initialises Inductor's code generators and hashes torch's source: ~0.7 s in
    every fresh process, as much as the whole warm compile of a small model. Raises
    ``BypassAOTAutogradCache`` (AOTAutograd then compiles without the cache) for what it cannot
    key: symbolic shapes, submodule calls, opaque attributes.
    """
    gm = mod.gm if hasattr(mod, "gm") and not isinstance(mod, torch.fx.GraphModule) else mod
    autograd_cache.check_cacheable(gm)
    if any(name.startswith("saved_tensors_hooks") for name in [*gm.__dict__, *gm._modules]) or getattr(
            torch._functorch.config, "joint_custom_pass", None) is not None:
        raise BypassAOTAutogradCache("saved-tensor hooks or a custom joint pass")
    digest = hashlib.sha256()
    _module_key(gm, digest)
    settings = {
        "inputs": [_input_key(x) for x in example_inputs],
        # Which inputs share memory decides how AOTAutograd handles their mutations.
        "aliases": _alias_classes(example_inputs),
        "default_dtype": str(torch.get_default_dtype()),
        "aot_config": {name: repr(getattr(aot_config, name, None)) for name in _AOT_CONFIG_KEY_FIELDS},
        "grad_enabled": torch.is_grad_enabled(),
        "autocast": {d: str(torch.get_autocast_dtype(d)) for d in torch._C._autocast_supported_devices()
                     if torch.is_autocast_enabled(d)},
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "torch": [torch.__version__, torch.version.git_version],
        "compiler_config_extra": repr(compiler_config_extra),
        "salt": salt,
    }
    digest.update(json.dumps(settings, sort_keys=True, default=repr).encode())
    digest.update(torch._functorch.config.save_config())
    # The prefix names the kind of entry in PyTorch's cache directory ("a" in torch versions that do not define it).
    return getattr(autograd_cache, "AOTAUTOGRAD_CACHE_PREFIX", "a") + "adreno" + digest.hexdigest(), []


def serializable(compiler: Any, config: Config) -> Any:
    """``compiler`` as AOTAutograd needs it to consult the cache (it only does for such compilers)."""
    return SerializableAOTDispatchCompiler(OutputCode, compiler) if cache_usable(config) else compiler


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


#: Outputs up to this many elements whose layout interleaves dimensions are checked for overlap
#: element by element (once, at compile time); larger ones stay dense.
_OVERLAP_CHECK_ELEMENTS = 1 << 24


def _non_overlapping(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether no two elements of a tensor of this shape and these strides share memory."""
    dims = sorted((stride, size) for size, stride in zip(shape, strides, strict=True) if size > 1)
    reach = 1  # elements spanned by the dimensions of smaller stride
    for stride, size in dims:
        if stride == 0:
            return False
        if stride < reach:  # interleaved (a strided slice of a permuted tensor): count the offsets
            numel = math.prod(shape)
            if numel > _OVERLAP_CHECK_ELEMENTS:
                return False
            # numpy, not torch: this runs while the compile's fake-tensor mode is active.
            offsets = np.zeros((), dtype=np.int64)
            for extent, step in zip(shape, strides, strict=True):
                offsets = offsets[..., None] + np.arange(extent, dtype=np.int64) * step
            return int(np.unique(offsets).size) == numel
        reach = stride * size
    return True


def _outputs_to_restride(program: KernelProgram, output_strides: Sequence[tuple[int, ...] | None]
                         ) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(position, eager's strides) of the host outputs the program computes (not inputs passed
    through, not device-resident) whose eager strides are not the row-major ones of our buffers:
    channels_last results, transposed or permuted outputs. Outputs whose elements overlap (an
    expanded view) cannot be written in eager's layout and stay dense."""
    graph = program.graph
    inputs = graph.input_buffers()
    restrided = []
    for position, (out, strides) in enumerate(zip(graph.outputs, output_strides, strict=False)):
        if strides is None or out.buffer is None or out.buffer in inputs or out.role is not OutputRole.HOST:
            continue
        shape = out.shape if out.shape is not None else graph.buffers[out.buffer].shape
        if len(strides) == len(shape) and any(size > 1 and stride != dense for size, stride, dense in zip(
                shape, strides, _contiguous_strides(shape), strict=True)) and _non_overlapping(shape, strides):
            restrided.append((position, tuple(strides)))
    return tuple(restrided)


class CompiledGraph(OutputCode):
    """One compiled graph as AOTAutograd calls and caches it (boxed: ``graph(list_of_args)``).

    Holds what survives a process (the program and how to bind it) and, once bound, the
    :class:`Executable`. Pickled without the Executable; bound again on first use after loading.
    A call appends the frozen copies its graph reads after the caller's arguments
    (:mod:`torch_adreno.frontend.frozen_casts`); they are static inputs, resident like parameters.
    """

    def __init__(self, program: KernelProgram, config: Config, static_inputs: Sequence[int] = (),
                 version_bumped_inputs: Sequence[int] = (),
                 output_strides: Sequence[tuple[int, ...] | None] = (),
                 frozen_copies: FrozenCopyInputs = NO_FROZEN_COPIES) -> None:
        super().__init__()
        self._boxed_call = True
        self.program = program
        self.device = config.device
        self.zero_copy = config.zero_copy
        self.tune = config.tune
        self.verify_memory = config.verify_memory
        self.fill_uninitialized_memory = config.fill_uninitialized_memory
        self.frozen_copies = frozen_copies
        self.static_inputs = (*static_inputs, *frozen_copies.positions)
        self.version_bumped_inputs = tuple(version_bumped_inputs)
        self.restrided_outputs = _outputs_to_restride(program, output_strides)
        graph = program.graph
        # Python floats as 0-dim float64 tensors: computed in float32 (lowering.context.ir_dtype).
        self.float64_inputs = tuple(pos for pos, name in enumerate(graph.inputs) if name in graph.float64_inputs)
        self.float64_outputs = tuple(pos for pos in sorted(graph.float64_outputs)
                                     if graph.outputs[pos].role is OutputRole.HOST)
        self.executable: Executable | None = None
        self._held_copies: list[Any] = []

    def bind(self) -> Executable:
        """Build the program's kernels and buffers on the device (once)."""
        if self.executable is None:
            runtime = get_runtime(self.device)
            self.executable = Executable(self.program, runtime, get_residency(runtime, self.zero_copy),
                                         self.static_inputs, tune=self.tune,
                                         version_bumped_inputs=self.version_bumped_inputs,
                                         verify_memory=self.verify_memory, restrided_outputs=self.restrided_outputs,
                                         fill_uninitialized_memory=self.fill_uninitialized_memory)
        return self.executable

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        if self.frozen_copies:
            inputs = self.frozen_copies.extend(inputs, self.program.graph.name)
            # Held until the next call: the copies live as long as a graph that reads them.
            self._held_copies = inputs[self.frozen_copies.first:]
        # Boxed: the very list AOTAutograd passes, which the Executable may clear as it goes.
        if self.float64_inputs:
            inputs = [value.to(torch.float32) if position in self.float64_inputs and type(value) is torch.Tensor
                      and value.dtype == torch.float64 else value for position, value in enumerate(inputs)]
        outputs = self.bind()(inputs)  # type: ignore[arg-type]
        for position in self.float64_outputs:
            if isinstance(outputs[position], torch.Tensor):
                outputs[position] = outputs[position].to(torch.float64)
        return outputs

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "executable": None, "_held_copies": []}

    def prepare_for_serialization(self) -> None:
        if any(isinstance(step, HostStep) for step in self.program.steps):
            # A host-fallback step runs a Python closure of the traced op, which does not pickle.
            raise BypassAOTAutogradCache(f"{self.program.graph.name} runs ops on the host (fallback='host')")
        self.executable = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        """Loaded from the cache: take the name of the region being compiled now (an entry may
        have been written by another region, in this process or an earlier one), then bind."""
        kind = self.program.graph.name.rsplit("_", 1)[0]
        compiling = _compiling.get()
        if compiling is not None:
            self.program = self.program.renamed(f"{kind}_{compiling[1]}")
        self.bind()

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass
