"""Which saved activations a backward may overwrite once it has read them for the last time.

The forward returns the tensors it saves for the backward as device buffers of their own
(:class:`~torch_adreno.runtime.device_tensor.DeviceTensor`); the backward's memory plan reuses
such a buffer's bytes after its last read (*donation*). That is only sound when no other tensor
still to be read lives in those bytes. Several saved tensors can be views of one storage: a
LayerNorm output read by two LoRA adapters is saved once per reader, as ``view(n, [T, d])`` twice,
and both arrive as handles on one buffer. Donating the first view's bytes after its last read
overwrites the second view before the backward reads it: silently wrong gradients.

The rule, decided on the partitioned FX graphs from the fake tensors' storages (what eager
aliases), per storage that saved tensors live in:

* never donated when a forward input (a parameter, the batch), a forward output the user gets,
  the new value of an input the forward updates in place, or a backward output lives there too;
* else, when one saved tensor covers the whole storage, that tensor is the donor and every other
  saved tensor of the storage is an *alias*: the bytes are free only after the last read of all;
* else (views that each cover part of it) nothing of the storage is donated.

Invariant: a donated placeholder's storage holds no tensor the plan does not see read: the
memory stage keeps a donor busy until the last read of each of its aliases.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten


@dataclass(frozen=True)
class Donation:
    """Backward placeholders whose bytes the backward may reuse, and for each the other
    placeholders that are views of the same storage (read before the bytes are free)."""

    donated: frozenset[str] = frozenset()
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Why saved tensors were not donated, for the debug dump: placeholder -> reason.
    refused: dict[str, str] = field(default_factory=dict)


#: No saved tensor donated (a forward, or a backward whose partition we did not see).
NO_DONATION = Donation()


def _storage(value: Any) -> StorageWeakRef | None:
    if not isinstance(value, torch.Tensor) or value.layout is not torch.strided:
        return None
    try:
        return StorageWeakRef(value.untyped_storage())
    except (NotImplementedError, RuntimeError):  # a tensor without storage (a subclass, say)
        return None


def _storages(nodes: Iterable[Any]) -> set[StorageWeakRef]:
    found = set()
    for node in nodes:
        if isinstance(node, Node):
            storage = _storage(node.meta.get("val"))
            if storage is not None:
                found.add(storage)
    return found


def _output_args(gm: GraphModule) -> list[Any]:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0]
    return list(values) if isinstance(values, list | tuple) else [values]


def _covers_storage(value: torch.Tensor) -> bool:
    return (value.storage_offset() == 0 and value.is_contiguous()
            and value.numel() * value.element_size() == value.untyped_storage().nbytes())


def donatable_saved_tensors(fw: GraphModule, bw: GraphModule, num_fwd_outputs: int) -> Donation:
    """The :class:`Donation` for a partitioned forward ``fw`` and backward ``bw`` (the forward's
    outputs past ``num_fwd_outputs`` are the saved tensors, the backward's placeholders of the same
    names)."""
    fw_outputs = _output_args(fw)
    saved = [n for n in fw_outputs[num_fwd_outputs:] if isinstance(n, Node)]
    bw_inputs = {n.name for n in bw.graph.nodes if n.op == "placeholder"}
    mutation_values = [n.args[1] for n in fw.graph.nodes
                       if n.op == "call_function" and n.target is aten.copy_.default
                       and isinstance(n.args[0], Node) and n.args[0].op == "placeholder"]
    kept = (_storages(n for n in fw.graph.nodes if n.op == "placeholder")
            | _storages(fw_outputs[:num_fwd_outputs]) | _storages(mutation_values) | _storages(_output_args(bw)))
    by_storage: dict[StorageWeakRef, list[Node]] = defaultdict(list)
    refused: dict[str, str] = {}
    for node in dict.fromkeys(saved):
        if node.name not in bw_inputs:
            continue
        storage = _storage(node.meta.get("val"))
        if node.op != "call_function":
            refused[node.name] = "a forward input passed through"
        elif storage is None:
            refused[node.name] = "no storage to reuse"
        elif storage in kept:
            refused[node.name] = "shares its storage with a forward input, a user output or a backward output"
        else:
            by_storage[storage].append(node)
    donated: set[str] = set()
    aliases: dict[str, tuple[str, ...]] = {}
    for group in by_storage.values():
        covering = [n for n in group if _covers_storage(n.meta["val"])]
        if not covering:
            for node in group:
                refused[node.name] = "a partial view of a storage other saved tensors share"
            continue
        donor = covering[0]
        donated.add(donor.name)
        others = tuple(n.name for n in group if n is not donor)
        if others:
            aliases[donor.name] = others
            for name in others:
                refused[name] = f"a view of {donor.name}'s storage, which is donated after the last read of both"
    return Donation(frozenset(donated), aliases, refused)
