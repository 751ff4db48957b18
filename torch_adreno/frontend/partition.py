"""The partition of a joint forward-and-backward graph into the forward and the backward, and
what it decides for each: AOTAutograd's min-cut partitioner, after our rewrites of the joint graph
(casts of inputs and saved views recomputed in the backward), then the frozen copies each graph
reads, the saved tensors the backward may overwrite, and the gradients' strides. Each graph
carries its :class:`PartitionedGraph` in its ``meta`` to its compiler
(:mod:`~torch_adreno.frontend.region`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule

from torch_adreno.config import Config
from torch_adreno.frontend.donation import NO_DONATION, Donation, donatable_saved_tensors
from torch_adreno.frontend.frozen_casts import CASTS, frozen_in_partition, split_partitioned
from torch_adreno.frontend.gradient_layout import gradient_strides
from torch_adreno.frontend.saved_views import recompute_saved_views
from torch_adreno.runtime.frozen import NO_FROZEN_COPIES, FrozenCopyInputs


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


def make_partition(config: Config) -> Callable[..., tuple[GraphModule, GraphModule]]:
    """AOTAutograd's ``partition_fn`` for ``config``: the joint graph into forward and backward,
    each with its :class:`PartitionedGraph` under :data:`PARTITION_KEY` in its ``meta``."""

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

    return partition
