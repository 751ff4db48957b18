"""The ``adreno`` backend's entry point, as ``torch.compile`` calls it: the options checked into a
:class:`~torch_adreno.config.Config`, then the graph compiled now or, where Dynamo traced it
with symbolic shapes, per concrete shape at its first calls."""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

from torch_adreno.config import Config
from torch_adreno.errors import OptionError, SymbolicShapeError
from torch_adreno.frontend import tracing
from torch_adreno.frontend.specialization import ShapeSpecialized, is_symbolic
from torch_adreno.frontend.tracing import ChoicesOverride


def backend_config(options: dict[str, Any] | None = None, **kwargs: Any) -> Config:
    """The backend's arguments from ``torch.compile`` (``options=``; ``mode=`` is refused) as a
    Config; an :class:`OptionError` naming what is wrong otherwise. Installed with
    :mod:`torch_adreno.frontend`, :mod:`torch_adreno.torch_patches` checks them at
    ``torch.compile`` itself, not at the first call."""
    if kwargs:
        raise OptionError(
            f"the adreno backend takes no {', '.join(map(repr, kwargs))} argument; pass settings as "
            "torch.compile(model, backend='adreno', options={...})"
        )
    return Config.from_options(options)


def adreno_backend(gm: GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None, *,
                   kernel_choices: ChoicesOverride | None = None, **kwargs: Any) -> Any:
    """The ``torch.compile`` backend entry point (``backend="adreno"``).

    ``kernel_choices`` (not an option: for tests and benchmarks, as
    ``backend=functools.partial(adreno_backend, kernel_choices=f)``): a function of the
    :class:`~torch_adreno.kernels.KernelChoices` made for the device, returning those to compile
    with (a GEMM template or tile rule the device would not get)."""
    config = backend_config(options, **kwargs)
    # Dynamo's traced values too: some torch versions (2.11 on a recompiled optimizer step) hand
    # concrete example inputs for a graph traced with symbolic sizes.
    traced = [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]
    if any(is_symbolic(x) for x in [*example_inputs, *traced]):
        return ShapeSpecialized(gm, config, kernel_choices)
    try:
        return tracing.trace_and_compile(config, gm, example_inputs, kernel_choices=kernel_choices)
    except SymbolicShapeError:
        # AOTAutograd traced symbolic sizes that neither the inputs nor Dynamo's metadata showed
        # (torch 2.11, an optimizer step recompiled after another model's): per concrete shape.
        return ShapeSpecialized(gm, config, kernel_choices)
