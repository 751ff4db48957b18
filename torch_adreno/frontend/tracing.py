"""Tracing one Dynamo graph: under Dynamo's compile lock, with the process-wide switches the trace
needs, the kernel choices made for the device, and the compile cache around AOTAutograd."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._dynamo.convert_frame import compile_lock
from torch.fx import GraphModule

from torch_adreno.config import Config
from torch_adreno.frontend import compile_cache
from torch_adreno.frontend.fused_cross_entropy import fuse_head_and_loss
from torch_adreno.frontend.region import make_backend
from torch_adreno.kernels import KernelChoices
from torch_adreno.runtime import get_runtime
from torch_adreno.targets.profiles import profile_for

#: A function of the kernel choices made for the device, returning those to compile with.
ChoicesOverride = Callable[[KernelChoices], KernelChoices]

_graph_ids = itertools.count()


def _tracing_context(example_inputs: list[Any]) -> contextlib.AbstractContextManager[Any]:
    """Dynamo's tracing context, or where a graph is compiled at its first call (a shape
    specialisation, outside Dynamo) one of our own: AOTAutograd leaves its metadata there, which
    the compilers read (static inputs, version bumps, buffer donation to decline)."""
    if torch._guards.TracingContext.try_get() is not None:
        return contextlib.nullcontext()
    fake_mode = torch._guards.detect_fake_mode(example_inputs)
    return torch._guards.tracing(torch._guards.TracingContext(fake_mode))


def hold_compile_lock() -> contextlib.AbstractContextManager[Any]:
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


def trace_and_compile(config: Config, gm: GraphModule, example_inputs: list[Any],
                      kernel_choices: ChoicesOverride | None = None) -> Any:
    """One Dynamo graph traced by AOTAutograd and compiled as a region of its own, under Dynamo's
    compile lock. The :class:`KernelChoices` are made here, once for the region's graphs, from the
    device (narrowed to ``config.target``) and ``config``; ``kernel_choices``, where given, turns
    them into those to compile with (tests and benchmarks pick a GEMM template or tile rule so;
    the compile cache keys on the result)."""
    # The partitioner reads its budget from functorch's config while it partitions, which
    # happens inside this call (not later, at the first backward). Its common-subexpression
    # pass is off: it imports Inductor's lowering modules (~0.7 s of a process's first
    # compile) and gains nothing here, since our lowering shares index maps and fusion
    # inlines cheap producers anyway; measured: the same launches and bytes per step on mlp,
    # lenet and resnet_mini, and fewer on the transformer (80 vs 82 launches, 158 vs 161 MB).
    with hold_compile_lock(), _mkldnn_rnn_off(gm):
        profile = profile_for(get_runtime(config.device).profile, config.target)
        choices = KernelChoices.for_device(profile, config)
        if kernel_choices is not None:
            choices = kernel_choices(choices)
        fuse_head_and_loss(gm, config, profile.global_mem_bytes)
        region = next(_graph_ids)
        with (torch._functorch.config.patch(activation_memory_budget=config.activation_memory_budget, cse=False),
              _tracing_context(example_inputs), compile_cache.caching(gm, config, region, choices)):
            return make_backend(config, region, choices)(gm, example_inputs)
