"""One FX graph through the compiler's stages: lowering -> fusion -> memory -> kernels, then bound
to the device as the :class:`~torch_adreno.frontend.compile_cache.CompiledGraph` AOTAutograd calls.

The stages choose no code themselves from the device: they read the :class:`KernelChoices` made
once per compiled region (:func:`torch_adreno.frontend.tracing.trace_and_compile`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch.fx import GraphModule

from torch_adreno.config import Config
from torch_adreno.errors import OptionError
from torch_adreno.frontend import debug
from torch_adreno.frontend.compile_cache import CompiledGraph
from torch_adreno.frontend.donation import NO_DONATION, Donation
from torch_adreno.fusion import fuse, max_kernel_buffers
from torch_adreno.kernels import KernelChoices, KernelProgram, render_program
from torch_adreno.kernels.verify import verify_program
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import plan_memory
from torch_adreno.runtime import get_residency, get_runtime
from torch_adreno.runtime.frozen import NO_FROZEN_COPIES, FrozenCopyInputs
from torch_adreno.targets.profiles import profile_for


def compile_program(gm: GraphModule, config: Config, name: str, num_host_outputs: int | None,
                    donation: Donation = NO_DONATION, resident_outputs: bool = False,
                    choices: KernelChoices | None = None) -> KernelProgram:
    """Run one FX graph through the stages lowering -> fusion -> memory -> kernels, with the code
    ``choices`` made for the device (default: :meth:`KernelChoices.for_device` under ``config``)."""
    runtime = get_runtime(config.device)
    residency = get_residency(runtime, config.zero_copy)
    # With a target, every stage plans within both the present device's and the target's limits.
    profile = profile_for(runtime.profile, config.target)
    if config.native_half and not profile.fp16:
        raise OptionError(
            f"option native_half=True needs the cl_khr_fp16 extension, which {runtime.profile.name} "
            f"({runtime.profile.platform}) does not report; leave native_half off (float16 tensors are still "
            "stored in 16 bits and computed in float32 registers)")
    choices = choices if choices is not None else KernelChoices.for_device(profile, config)
    graph = lower_graph(gm, config, name, num_host_outputs)
    fused = fuse(graph, config, max_kernel_buffers(profile.max_parameter_bytes, profile.address_bits), choices.split)
    plan = plan_memory(fused, profile, reuse=config.memory_reuse, shared_outputs=residency.zero_copy,
                       donated=donation.donated, resident_outputs=resident_outputs,
                       donor_aliases=donation.aliases)
    program = render_program(fused, plan, profile, choices)
    if config.debug_dir:
        debug.dump(config.debug_dir, gm, graph, fused, plan, program)
    if config.verify_memory:
        verify_program(program, fills=config.fill_uninitialized_memory)
    return program


def compile_graph(gm: GraphModule, config: Config, name: str, num_host_outputs: int | None,
                  static_inputs: Sequence[int] = (), donation: Donation = NO_DONATION,
                  version_bumped_inputs: Sequence[int] = (), resident_outputs: bool = False,
                  frozen_copies: FrozenCopyInputs = NO_FROZEN_COPIES,
                  output_strides: Sequence[tuple[int, ...] | None] = (),
                  choices: KernelChoices | None = None) -> CompiledGraph:
    """One FX graph compiled and bound to the device, as AOTAutograd calls it; its outputs come
    back with the strides eager gives them (as traced: the output node's example values), or
    where ``output_strides`` names strides for an output, with those.
    ``frozen_copies``: the inputs after the caller's that the call fills with frozen copies;
    ``choices``: the code choices made for the device (:func:`compile_program`)."""
    program = compile_program(gm, config, name, num_host_outputs, donation, resident_outputs, choices)
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
