"""Graphs Dynamo traced with symbolic shapes, compiled per concrete input signature at their first
call (kernels are generated for static shapes), at most :data:`MAX_SPECIALIZATIONS` per graph."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.convert_frame import preserve_global_state
from torch.fx import GraphModule
from torch.utils._python_dispatch import _disable_current_modes

from torch_adreno.config import Config
from torch_adreno.errors import ShapeLimitError
from torch_adreno.frontend import tracing
from torch_adreno.frontend.tracing import ChoicesOverride

#: Distinct input shapes one symbolic graph is specialised for before it is an error (a changing
#: sequence length or batch size costs one compile per distinct shape).
MAX_SPECIALIZATIONS = 16


def is_symbolic(value: Any) -> bool:
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
    :func:`~torch_adreno.frontend.tracing.trace_and_compile`), while other signatures already
    compiled keep running. ``kernel_choices``: as :func:`~torch_adreno.frontend.tracing.trace_and_compile` takes it."""

    def __init__(self, gm: GraphModule, config: Config, kernel_choices: ChoicesOverride | None = None) -> None:
        self.gm = gm
        self.config = config
        self.kernel_choices = kernel_choices
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
        with tracing.hold_compile_lock(), _disable_current_modes():
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
            fn = preserve_global_state(tracing.trace_and_compile)(self.config, self.gm, list(args),
                                                                  kernel_choices=self.kernel_choices)
            self.compiled[key] = fn
            return fn
