"""The ``adreno`` torch.compile backend: Dynamo graph -> AOTAutograd -> our pipeline.

AOTAutograd traces the forward and backward of each compiled region, decomposes them to the op
set in :func:`decomposition_table`, and partitions the joint graph. Each graph then goes through
the stages lowering -> fusion -> memory -> kernels, and AOTAutograd calls the resulting
:class:`~torch_adreno.frontend.compile_cache.CompiledGraph` s (each binds its program to the device as an
:class:`Executable`), which it also keeps in its disk cache (:mod:`torch_adreno.frontend.compile_cache`).
Forward outputs past the user's outputs are tensors saved for
the backward: they stay on the device as DeviceTensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._dynamo.convert_frame import compile_lock, preserve_global_state
from torch._dynamo.utils import counters, flatten_graph_inputs
from torch._functorch.aot_autograd import aot_module_simplified
from torch.fx import GraphModule
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils._python_dispatch import _disable_current_modes

from torch_adreno import torch_patches
from torch_adreno.config import Config
from torch_adreno.errors import OptionError, ShapeLimitError, SymbolicShapeError
from torch_adreno.frontend import compile_cache, debug
from torch_adreno.frontend.attention_pattern import fuse_attention_patterns
from torch_adreno.frontend.compile_cache import CompiledGraph
from torch_adreno.frontend.decompositions import OWN_DECOMPOSITIONS, UNFUSED_ATTENTION
from torch_adreno.frontend.donation import NO_DONATION, Donation, donatable_saved_tensors
from torch_adreno.frontend.frozen_casts import (
    CASTS,
    frozen_in_partition,
    split_inference,
    split_partitioned,
)
from torch_adreno.frontend.fused_cross_entropy import DECOMPOSITIONS as FUSED_HEAD_DECOMPOSITIONS
from torch_adreno.frontend.fused_cross_entropy import fuse_head_and_loss
from torch_adreno.frontend.gradient_layout import gradient_strides
from torch_adreno.frontend.saved_views import recompute_saved_views
from torch_adreno.fusion import fuse, max_kernel_buffers
from torch_adreno.kernels import KernelProgram, render_program
from torch_adreno.kernels.gemm import large_tiles_apply
from torch_adreno.kernels.verify import verify_program
from torch_adreno.lowering import lower_graph
from torch_adreno.lowering.checks import data_dependent_shape_error, with_eager_checks
from torch_adreno.memory import plan_memory
from torch_adreno.runtime import get_residency, get_runtime
from torch_adreno.runtime.frozen import NO_FROZEN_COPIES, FrozenCopyInputs
from torch_adreno.runtime.images import images_enabled
from torch_adreno.targets.profiles import profile_for

aten = torch.ops.aten

#: Composite ops that are decomposed into primitives we lower (beyond PyTorch's core ATen set).
EXTRA_DECOMPOSITIONS = [
    aten._log_softmax.default,
    aten._softmax.default,
    aten.native_layer_norm.default,
    aten.native_layer_norm_backward.default,
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit_no_training.default,
    aten.native_batch_norm_backward.default,
    aten.native_group_norm.default,
    aten.native_group_norm_backward.default,
    aten.gelu.default,
    aten.gelu_backward.default,
    aten.leaky_relu.default,
    aten.leaky_relu_backward.default,
    aten.elu.default,
    aten.elu_backward.default,
    aten.hardtanh.default,
    aten.hardtanh_backward.default,
    aten.hardswish.default,
    aten.hardswish_backward.default,
    aten.hardsigmoid.default,
    aten.hardsigmoid_backward.default,
    aten.silu.default,
    aten.silu_backward.default,
    aten.mish.default,
    aten.softplus.default,
    aten.softplus_backward.default,
    aten.index_add.default,
    aten.index_copy.default,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.lerp.Scalar,
    aten.lerp.Tensor,
    aten.addcmul.default,
    aten.addcdiv.default,
    aten.mse_loss.default,
    aten.mse_loss_backward.default,
    aten.binary_cross_entropy_with_logits.default,
    aten.smooth_l1_loss.default,
    aten.huber_loss.default,
    aten.repeat.default,
    aten.linalg_vector_norm.default,
    aten._weight_norm_interface.default,
]

_graph_ids = itertools.count()


@functools.cache
def decomposition_table(fused_attention: bool = True) -> dict[Any, Callable[..., Any]]:
    """The ops the backend has AOTAutograd decompose, and how (``fused_attention``: the option)."""
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(EXTRA_DECOMPOSITIONS))
    table.update(OWN_DECOMPOSITIONS if fused_attention else {**OWN_DECOMPOSITIONS, **UNFUSED_ATTENTION})
    checked = {op: with_eager_checks(op, decomposition) for op, decomposition in table.items()}
    return checked | FUSED_HEAD_DECOMPOSITIONS


class _Decompositions(Mapping[Any, Callable[..., Any]]):
    """:func:`decomposition_table` for ``config``, built at its first read: AOTAutograd reads it
    only to trace, which a graph loaded from the compile cache skips (building it costs ~0.15 s per
    process)."""

    def __init__(self, config: Config) -> None:
        self._fused_attention = config.fused_attention

    def __getitem__(self, op: Any) -> Callable[..., Any]:
        return decomposition_table(self._fused_attention)[op]

    def __iter__(self) -> Iterator[Any]:
        return iter(decomposition_table(self._fused_attention))

    def __len__(self) -> int:
        return len(decomposition_table(self._fused_attention))


def compile_program(gm: GraphModule, config: Config, name: str, num_host_outputs: int | None,
                    donation: Donation = NO_DONATION, resident_outputs: bool = False) -> KernelProgram:
    """Run one FX graph through the stages lowering -> fusion -> memory -> kernels."""
    runtime = get_runtime(config.device)
    residency = get_residency(runtime, config.zero_copy)
    # With a target, every stage plans within both the present device's and the target's limits.
    profile = profile_for(runtime.profile, config.target)
    graph = lower_graph(gm, config, name, num_host_outputs)
    fused = fuse(graph, config, max_kernel_buffers(profile.max_parameter_bytes, profile.address_bits),
                 profile.compute_units, large_tiles_apply(profile))
    plan = plan_memory(fused, profile, reuse=config.memory_reuse, shared_outputs=residency.zero_copy,
                       donated=donation.donated, resident_outputs=resident_outputs,
                       donor_aliases=donation.aliases)
    if config.native_half and not profile.fp16:
        raise OptionError(
            f"option native_half=True needs the cl_khr_fp16 extension, which {runtime.profile.name} "
            f"({runtime.profile.platform}) does not report; leave native_half off (float16 tensors are still "
            "stored in 16 bits and computed in float32 registers)")
    program = render_program(fused, plan, profile, images=images_enabled(config.images, profile),
                             native_half=config.native_half)
    if config.debug_dir:
        debug.dump(config.debug_dir, gm, graph, fused, plan, program)
    if config.verify_memory:
        verify_program(program, fills=config.fill_uninitialized_memory)
    return program


def compile_graph(gm: GraphModule, config: Config, name: str, num_host_outputs: int | None,
                  static_inputs: Sequence[int] = (), donation: Donation = NO_DONATION,
                  version_bumped_inputs: Sequence[int] = (), resident_outputs: bool = False,
                  frozen_copies: FrozenCopyInputs = NO_FROZEN_COPIES,
                  output_strides: Sequence[tuple[int, ...] | None] = ()) -> CompiledGraph:
    """One FX graph compiled and bound to the device, as AOTAutograd calls it; its outputs come
    back with the strides eager gives them (as traced: the output node's example values), or
    where ``output_strides`` names strides for an output, with those.
    ``frozen_copies``: the inputs after the caller's that the call fills with frozen copies."""
    program = compile_program(gm, config, name, num_host_outputs, donation, resident_outputs)
    traced = _traced_output_strides(gm)
    strides = [asked if asked is not None else eager
               for eager, asked in itertools.zip_longest(traced, output_strides[:len(traced)])]
    compiled = CompiledGraph(program, config, static_inputs, version_bumped_inputs, strides, frozen_copies)
    compiled.bind()
    return compiled


def _traced_output_strides(gm: GraphModule) -> list[tuple[int, ...] | None]:
    """Per output of ``gm``, the strides of its traced value (None: not a tensor, or unknown)."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], list | tuple) else [output.args[0]]
    strides: list[tuple[int, ...] | None] = []
    for value in values:
        example = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        if isinstance(example, torch.Tensor) and all(isinstance(s, int) for s in example.stride()):
            strides.append(tuple(example.stride()))
        else:
            strides.append(None)
    return strides


def _static_input_indices() -> list[int]:
    """Positions of parameters and buffers among the forward's inputs (resident on the device)."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    return list(getattr(meta, "static_input_indices", None) or [])


def _version_bumped_input_indices(gm: GraphModule) -> list[int]:
    """Positions of the inputs whose version counter AOTAutograd bumps right before each call,
    because the graph updates them in place (an optimizer's parameters and state, BatchNorm's
    running statistics): the bump alone does not mean the host changed them. Empty unless
    AOTAutograd's inputs line up with the graph's."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if meta is None or len(getattr(meta, "input_info", ())) > placeholders:
        return []
    return list(getattr(meta, "mutated_graph_handled_indices_seen_by_autograd", None) or [])


def _decline_aot_buffer_donation() -> None:
    """Clear AOTAutograd's list of saved tensors its backward may overwrite. That donation serves
    Inductor's memory planner (ours is decided in the partition hook, below), and once the backward
    is compiled with the forward (as the compile cache does) AOTAutograd refuses any
    ``backward(retain_graph=True)`` over a non-empty list, which ``memory_reuse=False`` allows."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    if meta is not None and isinstance(getattr(meta, "bw_donated_idxs", None), list):
        meta.bw_donated_idxs.clear()  # in place: a subclass's outer metadata shares the list
    elif meta is not None and hasattr(meta, "bw_donated_idxs"):
        meta.bw_donated_idxs = []


def _recompute_input_casts(joint: GraphModule) -> None:
    """Have the backward cast the forward's inputs again instead of saving the casts: autocast's
    float16 copy of a float32 weight, read by the forward's and the backward's matrix products.
    A cast fuses into the kernel that reads it (no kernel, no buffer); saved, it would be a forward
    kernel writing the copy, and saved-activation memory. The partitioner counts the copy as
    cheaper to save than the weight, which it does not know is resident anyway."""
    from torch.utils.checkpoint import CheckpointPolicy

    for node in joint.graph.nodes:
        if node.op != "call_function" or node.target not in CASTS:
            continue
        source = node.args[0]
        if isinstance(source, torch.fx.Node) and source.op == "placeholder" and source.name.startswith("primals"):
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE


#: The key of a partitioned graph's :class:`PartitionedGraph` in its ``meta``.
PARTITION_KEY = "torch_adreno.partition"


@dataclasses.dataclass(frozen=True)
class PartitionedGraph:
    """What the partition decided of one forward or backward graph, handed to its compiler:
    ``num_host_outputs`` (forward: its outputs beyond these are saved for the backward and stay on
    the device), ``donation`` (backward: saved tensors whose bytes may serve it after their last
    read), ``frozen_copies`` (the inputs after the caller's that frozen copies fill) and
    ``output_strides`` (backward: each gradient's strides under autograd's layout contract,
    :mod:`~torch_adreno.frontend.gradient_layout`)."""

    frozen_copies: FrozenCopyInputs = NO_FROZEN_COPIES
    num_host_outputs: int | None = None
    donation: Donation = NO_DONATION
    output_strides: tuple[tuple[int, ...] | None, ...] = ()


def make_backend(config: Config, region: int) -> Callable[[GraphModule, list[Any]], Any]:
    def partition(joint: GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[GraphModule, GraphModule]:
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        _recompute_input_casts(joint)
        recompute_saved_views(joint)
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        static = kwargs.get("static_lifetime_input_indices") or ()
        frozen = frozen_in_partition(fw, bw, static) if config.frozen_casts else frozenset()
        fw_copies, bw_copies = split_partitioned(fw, bw, kwargs["num_fwd_outputs"], frozen)
        # (in the graphs' meta: AOTAutograd may hand a compiler a copy of the graph it was given,
        # and carries the meta along)
        fw.meta[PARTITION_KEY] = PartitionedGraph(fw_copies, num_host_outputs=kwargs["num_fwd_outputs"])
        bw.meta[PARTITION_KEY] = PartitionedGraph(bw_copies, donation=donatable_saved_tensors(fw, bw, kwargs["num_fwd_outputs"]),
                                                  output_strides=gradient_strides(joint, bw))
        return fw, bw

    def forward_compiler(gm: GraphModule, example_inputs: list[Any]) -> CompiledGraph:
        _decline_aot_buffer_donation()
        decided = gm.meta.get(PARTITION_KEY, PartitionedGraph())
        return compile_graph(gm, config, f"forward_{region}", decided.num_host_outputs,
                             _static_input_indices(), version_bumped_inputs=_version_bumped_input_indices(gm),
                             frozen_copies=decided.frozen_copies)

    def backward_compiler(gm: GraphModule, example_inputs: list[Any]) -> Any:
        decided = gm.meta.get(PARTITION_KEY, PartitionedGraph())
        compiled = compile_graph(gm, config, f"backward_{region}", None, donation=decided.donation,
                                 resident_outputs=True, frozen_copies=decided.frozen_copies,
                                 output_strides=decided.output_strides)
        # Autograd runs the backward outside Dynamo's reach; Dynamo must not trace it either.
        return torch._dynamo.disable(compiled, reason="do not trace generated backwards pass")

    def inference_compiler(gm: GraphModule, example_inputs: list[Any]) -> CompiledGraph:
        copies = split_inference(gm) if config.frozen_casts else NO_FROZEN_COPIES
        return compile_graph(gm, config, f"inference_{region}", None, _static_input_indices(),
                             version_bumped_inputs=_version_bumped_input_indices(gm), frozen_copies=copies)

    def compile_region(gm: GraphModule, example_inputs: list[Any]) -> Any:
        fuse_attention_patterns(gm)  # (hand-written softmax(q k^T) v as scaled_dot_product_attention)
        return _aot_autograd(
            gm, example_inputs,
            fw_compiler=compile_cache.serializable(forward_compiler, config),
            bw_compiler=compile_cache.serializable(torch._dynamo.disable(
                backward_compiler, reason="do not trace the backward compiler"), config),
            inference_compiler=compile_cache.serializable(inference_compiler, config),
            decompositions=_Decompositions(config),
            partition_fn=partition,
            # In-place updates of inputs (an optimizer step, BatchNorm statistics in eval-free graphs)
            # stay in the graph, so the device writes the new values where the inputs live.
            keep_inference_input_mutations=True,
        )

    return compile_region


def _aot_autograd(gm: GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """AOTAutograd over a Dynamo graph, as ``torch._dynamo.backends.common.aot_autograd`` runs it,
    except that Inductor's debug module is imported only when ``TORCH_COMPILE_DEBUG=1`` asks for
    its AOT logs: the import costs ~0.27 s of each process's first compile, a quarter of a warm
    compile from the cache. (The backward compiler is wrapped in ``torch._dynamo.disable`` by the
    caller, as that helper does.)"""
    if any(isinstance(x, list | tuple | dict) for x in example_inputs):
        return flatten_graph_inputs(gm, example_inputs, functools.partial(_aot_autograd, **kwargs))
    counters["aot_autograd"]["total"] += 1
    logging: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if os.environ.get("TORCH_COMPILE_DEBUG", "0") == "1":
        from torch._inductor.debug import enable_aot_logging

        logging = enable_aot_logging()
    try:
        with logging:
            compiled = aot_module_simplified(gm, example_inputs, **kwargs)
    except GuardOnDataDependentSymNode as err:
        counters["aot_autograd"]["not_ok"] += 1
        raise data_dependent_shape_error(gm, err) from None
    except Exception:
        counters["aot_autograd"]["not_ok"] += 1
        raise
    counters["aot_autograd"]["ok"] += 1
    return torch._dynamo.disable(compiled, reason="do not trace AOT-compiled graph")


#: Distinct input shapes one symbolic graph is specialised for before it is an error (a changing
#: sequence length or batch size costs one compile per distinct shape).
MAX_SPECIALIZATIONS = 16


def _is_symbolic(value: Any) -> bool:
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    return isinstance(value, torch.Tensor) and any(not isinstance(s, int) for s in value.shape)


def _describe_graph(gm: GraphModule) -> str:
    """Dynamo's compile id of ``gm`` and the parameters it reads, to tell the user which graph."""
    compile_id = gm.meta.get("dynamo_compile_id")
    parameters = list(gm.meta.get("dynamo_flat_name_to_original_fqn", {}).values())
    reads = f" (reads {', '.join(parameters[:6])}{', ...' if len(parameters) > 6 else ''})" if parameters else ""
    return f"graph {compile_id if compile_id is not None else '?'}{reads}"


def _input_names(gm: GraphModule) -> list[str]:
    """Each graph input as the user's code names it (Dynamo's source, e.g. ``L['x']``)."""
    names = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            source = getattr(node.meta.get("grapharg"), "source", None)
            names.append(str(source.name) if source is not None else node.name)
    return names


def _describe_signatures(names: Sequence[str], signatures: Sequence[tuple[Any, ...]]) -> list[str]:
    """Per signature, the inputs whose shape (or strides, or dtype) differ among ``signatures``."""
    varying = [i for i in range(len(signatures[0])) if len({s[i] for s in signatures}) > 1]
    tensors = [i for i in varying if isinstance(signatures[0][i][0], tuple)] or varying

    def describe(i: int, entry: tuple[Any, ...]) -> str:
        name = names[i] if i < len(names) else f"input {i}"
        if not isinstance(entry[0], tuple):
            return f"{name}={entry[1]!r}"
        text = f"{name}: {'x'.join(map(str, entry[0])) or 'scalar'}"
        if len({s[i][1] for s in signatures}) > 1:
            text += f" strides {entry[1]}"
        if len({s[i][2] for s in signatures}) > 1:
            text += f" {entry[2]}"
        return text

    return ["(" + ", ".join(describe(i, signature[i]) for i in tensors) + ")" for signature in signatures]


class ShapeSpecialized:
    """A graph Dynamo traced with symbolic shapes (after it saw a second batch size), compiled once
    per distinct concrete input signature at its first call: kernels are generated for static
    shapes. At most :data:`MAX_SPECIALIZATIONS` signatures.

    Thread-safe: a signature is compiled once, under Dynamo's compile lock (see
    :func:`trace_and_compile`), while other signatures already compiled keep running."""

    def __init__(self, gm: GraphModule, config: Config) -> None:
        self.gm = gm
        self.config = config
        self.compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}
        # Read while Dynamo's metadata is on the graph (it drops the inputs' sources after compiling).
        self.description = _describe_graph(gm)
        self.input_names = _input_names(gm)

    @staticmethod
    def signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else (type(a), a)
                     for a in args)

    def __call__(self, *args: Any) -> Any:
        key = self.signature(args)
        fn = self.compiled.get(key)
        if fn is None:
            fn = self._compile(key, args)
        return fn(*args)

    def _compile(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Callable[..., Any]:
        # As Dynamo compiles: under its lock, outside the caller's dispatch modes, with grad mode,
        # RNG state and FX's patches as the caller left them afterwards.
        with _compile_lock(), _disable_current_modes():
            fn = self.compiled.get(key)  # compiled by another thread while this one waited
            if fn is not None:
                return fn
            if len(self.compiled) >= MAX_SPECIALIZATIONS:
                *seen, new = _describe_signatures(self.input_names, [*self.compiled, key])
                raise ShapeLimitError(
                    f"{self.description} was called with new input shapes {new} after "
                    f"{MAX_SPECIALIZATIONS} others: the adreno backend compiles one program per distinct input "
                    f"shape, at most {MAX_SPECIALIZATIONS} per graph. Shapes seen: {'; '.join(seen)}. Pad inputs "
                    "to a few fixed shapes (bucket sequence lengths; drop the last partial batch with "
                    "DataLoader(drop_last=True))"
                )
            fn = preserve_global_state(trace_and_compile)(self.config, self.gm, list(args))
            self.compiled[key] = fn
            return fn


def backend_config(options: dict[str, Any] | None = None, **kwargs: Any) -> Config:
    """The backend's arguments from ``torch.compile`` (``options=``; ``mode=`` is refused) as a
    Config; an :class:`OptionError` naming what is wrong otherwise. Installed with this
    module, :mod:`torch_adreno.torch_patches` checks them at ``torch.compile`` itself, not at
    the first call."""
    if kwargs:
        raise OptionError(
            f"the adreno backend takes no {', '.join(map(repr, kwargs))} argument; pass settings as "
            "torch.compile(model, backend='adreno', options={...})"
        )
    return Config.from_options(options)


def adreno_backend(gm: GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None,
                   **kwargs: Any) -> Any:
    """The ``torch.compile`` backend entry point (``backend="adreno"``)."""
    config = backend_config(options, **kwargs)
    # Dynamo's traced values too: some torch versions (2.11 on a recompiled optimizer step) hand
    # concrete example inputs for a graph traced with symbolic sizes.
    traced = [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]
    if any(_is_symbolic(x) for x in [*example_inputs, *traced]):
        return ShapeSpecialized(gm, config)
    try:
        return trace_and_compile(config, gm, example_inputs)
    except SymbolicShapeError:
        # AOTAutograd traced symbolic sizes that neither the inputs nor Dynamo's metadata showed
        # (torch 2.11, an optimizer step recompiled after another model's): per concrete shape.
        return ShapeSpecialized(gm, config)


def _tracing_context(example_inputs: list[Any]) -> contextlib.AbstractContextManager[Any]:
    """Dynamo's tracing context, or where a graph is compiled at its first call (a shape
    specialisation, outside Dynamo) one of our own: AOTAutograd leaves its metadata there, which
    the compilers read (static inputs, version bumps, buffer donation to decline)."""
    if torch._guards.TracingContext.try_get() is not None:
        return contextlib.nullcontext()
    fake_mode = torch._guards.detect_fake_mode(example_inputs)
    return torch._guards.tracing(torch._guards.TracingContext(fake_mode))


def _compile_lock() -> contextlib.AbstractContextManager[Any]:
    """Dynamo's compile lock (reentrant: Dynamo holds it already when it calls the backend).

    Tracing with AOTAutograd flips process-wide state (FX's patcher and tracing flag, functorch's
    config and interpreter stack, ``torch.fx.graph_module._forward_from_src``): two traces at once
    in two threads corrupt each other. Every compile of ours, from Dynamo or at a graph's first
    call with a new shape, holds this lock, as Dynamo's own compiles do."""
    return compile_lock


def _calls_lstm(gm: GraphModule) -> bool:
    return any(node.op == "call_function" and "lstm" in getattr(node.target, "__name__", str(node.target))
               for node in gm.graph.nodes)


@contextlib.contextmanager
def _mkldnn_rnn_off(gm: GraphModule) -> Iterator[None]:
    """With MKL-DNN enabled, AOTAutograd traces nn.LSTM into one opaque CPU kernel
    (mkldnn_rnn_layer); without it, into the matmuls and gates our lowerings cover. The switch is
    process-wide, so it is flipped only for graphs that call an LSTM (under the compile lock), and
    restored after. (torch.backends.mkldnn.flags would also touch the TF32 setting and warn on
    every compile.)"""
    if not _calls_lstm(gm):
        yield
        return
    was_enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(was_enabled)


def trace_and_compile(config: Config, gm: GraphModule, example_inputs: list[Any]) -> Any:
    # The partitioner reads its budget from functorch's config while it partitions, which
    # happens inside this call (not later, at the first backward). Its common-subexpression
    # pass is off: it imports Inductor's lowering modules (~0.7 s of a process's first
    # compile) and gains nothing here, since our lowering shares index maps and fusion
    # inlines cheap producers anyway; measured: the same launches and bytes per step on mlp,
    # lenet and resnet_mini, and fewer on the transformer (80 vs 82 launches, 158 vs 161 MB).
    with _compile_lock(), _mkldnn_rnn_off(gm):
        fuse_head_and_loss(gm, config, profile_for(get_runtime(config.device).profile, config.target).global_mem_bytes)
        region = next(_graph_ids)
        with (torch._functorch.config.patch(activation_memory_budget=config.activation_memory_budget, cse=False),
              _tracing_context(example_inputs), compile_cache.caching(gm, config, region)):
            return make_backend(config, region)(gm, example_inputs)


# What this package changes in PyTorch (each change, its torch versions and why: torch_patches),
# installed before Dynamo can call the backend: this module is imported by the registry's first
# lookup of backend="adreno", at a torch.compile that names it, or by the public surface.
torch_patches.install(adreno_backend, backend_config)
