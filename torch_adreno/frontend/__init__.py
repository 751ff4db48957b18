"""The ``adreno`` torch.compile backend: Dynamo graph -> AOTAutograd -> our pipeline.

AOTAutograd traces the forward and backward of each compiled region, decomposes them to the op
set in :func:`decomposition_table`, and partitions the joint graph. Each graph then goes through
the stages lowering -> fusion -> memory -> kernels, and AOTAutograd calls the resulting
:class:`~torch_adreno.frontend.compile_cache.CompiledGraph` s (each binds its program to the device as an
:class:`Executable`), which it also keeps in its disk cache (:mod:`torch_adreno.frontend.compile_cache`).
Forward outputs past the user's outputs are tensors saved for
the backward: they stay on the device as DeviceTensors.

The modules, in the order a compile runs through them:

- :mod:`~torch_adreno.frontend.backend`: the entry point ``torch.compile`` calls and its options;
- :mod:`~torch_adreno.frontend.specialization`: graphs traced with symbolic shapes, compiled per
  concrete shape at their first calls;
- :mod:`~torch_adreno.frontend.tracing`: one graph traced under Dynamo's compile lock, with the
  kernel choices made for the device and the compile cache around it;
- :mod:`~torch_adreno.frontend.region`: AOTAutograd's forward, backward and inference compilers
  of one region, with the decompositions of :mod:`~torch_adreno.frontend.decomposition_table` and
  the partition of :mod:`~torch_adreno.frontend.partition`;
- :mod:`~torch_adreno.frontend.pipeline`: one FX graph through lowering, fusion, memory and kernels.
"""

from __future__ import annotations

from torch_adreno import torch_patches
from torch_adreno.frontend.backend import adreno_backend, backend_config
from torch_adreno.frontend.decomposition_table import EXTRA_DECOMPOSITIONS, decomposition_table
from torch_adreno.frontend.partition import PARTITION_KEY, PartitionedGraph
from torch_adreno.frontend.pipeline import compile_graph, compile_program
from torch_adreno.frontend.specialization import MAX_SPECIALIZATIONS, ShapeSpecialized
from torch_adreno.frontend.tracing import trace_and_compile

__all__ = [
    "EXTRA_DECOMPOSITIONS",
    "MAX_SPECIALIZATIONS",
    "PARTITION_KEY",
    "PartitionedGraph",
    "ShapeSpecialized",
    "adreno_backend",
    "backend_config",
    "compile_graph",
    "compile_program",
    "decomposition_table",
    "trace_and_compile",
]


# What this package changes in PyTorch (each change, its torch versions and why: torch_patches),
# installed before Dynamo can call the backend: this module is imported by the registry's first
# lookup of backend="adreno", at a torch.compile that names it, or by the public surface.
torch_patches.install(adreno_backend, backend_config)
