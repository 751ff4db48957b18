"""Multi-tensor grouping: independent pointwise kernels become the segments of one launch.

An optimizer step arrives as one chain of pointwise ops per parameter (PyTorch's single-tensor
path, which Dynamo traces for CPU tensors), so after scheduling it is one kernel per parameter:
resnet_mini's SGD step would be 60-odd launches moving a few kilobytes each. A launch costs
several microseconds of host enqueue whatever its size (6-9 us in NVIDIA's OpenCL driver, more on
a phone's slower cores), so, as PyTorch's foreach and fused optimizers do on CUDA, kernels that
do not depend on each other are launched together: one index space that is the concatenation of
their element ranges, each segment computing its own kernel's stores with its own buffers and
index expressions (``SegmentedKernel``).

The rule, applied to the scheduled kernels in order: a pointwise kernel joins the nearest earlier
launch of pointwise kernels when it depends on nothing at or after that launch (it reads no buffer
written there or later, and writes none read or written there or later), no host op runs in
between, and the launch stays within the device's kernel-argument bytes
(``CL_DEVICE_MAX_PARAMETER_SIZE``: at least 1024 bytes, 128 buffer pointers, on a full-profile
device); otherwise it starts a launch of its own. Joining moves the kernel up to that launch,
which is legal because nothing between depends on it (buffers are written once, by one kernel).
Adam's step thus becomes two launches (the per-parameter bias-correction scalars, then every
update, which reads them), SGD's one. Forward and backward graphs gain too (batch norm's
running-statistics updates, independent gradient epilogues): resnet_mini's forward goes from 46 to
29 launches. Moving a kernel up lengthens its results' lifetimes; the step's planned peak of the
four reference models is unchanged (``benchmarks/optimizer_launches.py``).

Memory (``memory/``) plans the grouped launch like any kernel: all its buffers are live at
its index, and a segment writes in place over a buffer only if no other segment reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_adreno.fusion.decisions import Decision
from torch_adreno.fusion.schedule import FusionGroup
from torch_adreno.fusion.specs import HostKernel, PointwiseKernel, SegmentedKernel

#: CL_DEVICE_MAX_PARAMETER_SIZE of every full-profile OpenCL device is at least this many bytes.
MIN_PARAMETER_BYTES = 1024


def max_kernel_buffers(max_parameter_bytes: int = MIN_PARAMETER_BYTES, address_bits: int = 64) -> int:
    """Buffer arguments one generated kernel may take on a device (its only kind of argument)."""
    return max(1, max_parameter_bytes // max(1, address_bits // 8))


@dataclass
class _Launch:
    groups: list[FusionGroup]
    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)

    def add(self, group: FusionGroup) -> None:
        self.groups.append(group)
        self.reads |= set(group.reads)
        self.writes |= set(group.writes)

    @property
    def pointwise(self) -> bool:
        return all(isinstance(g.spec, PointwiseKernel) for g in self.groups)

    def buffers_with(self, group: FusionGroup) -> int:
        return len(self.reads | self.writes | set(group.reads) | set(group.writes))


def _conflict(group: FusionGroup, launch: _Launch) -> str | None:
    """Why ``group`` must run after ``launch`` (None: they are independent)."""
    reads, writes = set(group.reads), set(group.writes)
    name = f"the launch of {launch.groups[0].name}"
    if isinstance(launch.groups[0].spec, HostKernel):
        return f"a host op ({name}) runs before it"
    if reads & launch.writes:
        return f"it reads {sorted(reads & launch.writes)[0]}, which {name} writes"
    if writes & launch.reads:
        return f"it writes {sorted(writes & launch.reads)[0]}, which {name} reads"
    if writes & launch.writes:
        return f"it writes {sorted(writes & launch.writes)[0]}, which {name} writes too"
    return None


def _target(group: FusionGroup, launches: list[_Launch], decisions: list[Decision], max_buffers: int) -> _Launch | None:
    """The nearest earlier pointwise launch ``group`` may join, recording why it may not where a
    pointwise launch precedes what stops it."""
    for position in range(len(launches) - 1, -1, -1):
        launch = launches[position]
        conflict = _conflict(group, launch)
        if conflict is None and launch.pointwise:
            if launch.buffers_with(group) <= max_buffers:
                return launch
            conflict = f"the launch would take more than {max_buffers} buffer arguments (the device's kernel parameter bytes)"
        if conflict is not None:
            blocked = next((lc for lc in reversed(launches[:position + 1]) if lc.pointwise), None)
            if blocked is not None:
                decisions.append(Decision(group.name, f"the launch of {blocked.groups[0].name}", False, conflict))
            return None
    return None


def group_independent_pointwise(groups: list[FusionGroup], decisions: list[Decision],
                                max_buffers: int) -> list[FusionGroup]:
    """``groups`` with independent pointwise kernels merged into segmented launches (see the module
    docstring), in an order where every kernel still runs after all it depends on."""
    launches: list[_Launch] = []
    for group in groups:
        target = _target(group, launches, decisions, max_buffers) if isinstance(group.spec, PointwiseKernel) else None
        if target is None:
            launches.append(_Launch([]))
            launches[-1].add(group)
            continue
        target.add(group)
        decisions.append(Decision(group.name, f"the launch of {target.groups[0].name}", True,
                                  "independent pointwise kernels: one launch, each kernel a segment of its index "
                                  "space (multi-tensor grouping)"))
    return [_merge(launch.groups) for launch in launches]


def _merge(groups: list[FusionGroup]) -> FusionGroup:
    if len(groups) == 1:
        return groups[0]
    segments = []
    for g in groups:
        assert isinstance(g.spec, PointwiseKernel)
        segments.append(g.spec)
    writes = list(dict.fromkeys(w for g in groups for w in g.writes))
    reads = list(dict.fromkeys(r for g in groups for r in g.reads))
    return FusionGroup(groups[0].name, SegmentedKernel(segments), [n for g in groups for n in g.nodes], reads, writes)
