"""The compilers of one compiled region (a Dynamo graph): AOTAutograd traces its forward and
backward (or, without gradients, its inference graph), decomposed and partitioned
(:mod:`~torch_adreno.frontend.partition`), and hands each graph to its compiler here, which runs it
through our stages (:mod:`~torch_adreno.frontend.pipeline`) with what AOTAutograd's metadata says
of its inputs. Every compiler goes through the compile cache
(:mod:`~torch_adreno.frontend.compile_cache`)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.utils import counters, flatten_graph_inputs
from torch._functorch.aot_autograd import aot_module_simplified
from torch.fx import GraphModule
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from torch_adreno.config import Config
from torch_adreno.frontend import compile_cache, pipeline
from torch_adreno.frontend.attention_pattern import fuse_attention_patterns
from torch_adreno.frontend.compile_cache import CompiledGraph
from torch_adreno.frontend.decomposition_table import LazyDecompositions
from torch_adreno.frontend.frozen_casts import split_inference
from torch_adreno.frontend.partition import PARTITION_KEY, PartitionedGraph, make_partition
from torch_adreno.kernels import KernelChoices
from torch_adreno.lowering.checks import data_dependent_shape_error
from torch_adreno.runtime.frozen import NO_FROZEN_COPIES


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
    Inductor's memory planner (ours is decided in the partition, :mod:`~torch_adreno.frontend.partition`), and once the backward
    is compiled with the forward (as the compile cache does) AOTAutograd refuses any
    ``backward(retain_graph=True)`` over a non-empty list, which ``memory_reuse=False`` allows."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    if meta is not None and isinstance(getattr(meta, "bw_donated_idxs", None), list):
        meta.bw_donated_idxs.clear()  # in place: a subclass's outer metadata shares the list
    elif meta is not None and hasattr(meta, "bw_donated_idxs"):
        meta.bw_donated_idxs = []


def make_backend(config: Config, region: int, choices: KernelChoices) -> Callable[[GraphModule, list[Any]], Any]:
    """The compiler of region number ``region`` under ``config``: AOTAutograd with our forward,
    backward and inference compilers, each compiling with the code ``choices`` made for the device."""

    def forward_compiler(gm: GraphModule, example_inputs: list[Any]) -> CompiledGraph:
        _decline_aot_buffer_donation()
        decided = gm.meta.get(PARTITION_KEY, PartitionedGraph())
        return pipeline.compile_graph(gm, config, f"forward_{region}", decided.num_host_outputs,
                                      _static_input_indices(), version_bumped_inputs=_version_bumped_input_indices(gm),
                                      frozen_copies=decided.frozen_copies, choices=choices)

    def backward_compiler(gm: GraphModule, example_inputs: list[Any]) -> Any:
        decided = gm.meta.get(PARTITION_KEY, PartitionedGraph())
        compiled = pipeline.compile_graph(gm, config, f"backward_{region}", None, donation=decided.donation,
                                          resident_outputs=True, frozen_copies=decided.frozen_copies,
                                          output_strides=decided.output_strides, choices=choices)
        # Autograd runs the backward outside Dynamo's reach; Dynamo must not trace it either.
        return torch._dynamo.disable(compiled, reason="do not trace generated backwards pass")

    def inference_compiler(gm: GraphModule, example_inputs: list[Any]) -> CompiledGraph:
        copies = split_inference(gm) if config.frozen_casts else NO_FROZEN_COPIES
        return pipeline.compile_graph(gm, config, f"inference_{region}", None, _static_input_indices(),
                                      version_bumped_inputs=_version_bumped_input_indices(gm),
                                      frozen_copies=copies, choices=choices)

    def compile_region(gm: GraphModule, example_inputs: list[Any]) -> Any:
        fuse_attention_patterns(gm)  # (hand-written softmax(q k^T) v as scaled_dot_product_attention)
        return _aot_autograd(
            gm, example_inputs,
            fw_compiler=compile_cache.serializable(forward_compiler, config),
            bw_compiler=compile_cache.serializable(torch._dynamo.disable(
                backward_compiler, reason="do not trace the backward compiler"), config),
            inference_compiler=compile_cache.serializable(inference_compiler, config),
            decompositions=LazyDecompositions(config),
            partition_fn=make_partition(config),
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
