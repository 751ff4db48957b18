"""The memory stage: FusedGraph -> MemoryPlan (:mod:`.plan`), and the verifier that proves a plan
never overwrites a value still to be read (:mod:`.verify`)."""

from torch_adreno.memory.plan import (
    Allocation,
    MemoryPlan,
    StorageKind,
    check_allocation,
    live_ranges,
    plan_memory,
)

__all__ = ["Allocation", "MemoryPlan", "StorageKind", "check_allocation", "live_ranges", "plan_memory"]
