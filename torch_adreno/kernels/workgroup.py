"""Work-group (local) size selection: a cheap heuristic from device properties and global size.

Mobile GPUs lose up to a third of their speed to badly chosen work-group sizes, so no kernel is
launched with a NULL local size: the driver's choice is not trusted.
"""

from __future__ import annotations

from torch_adreno.target import DeviceProfile


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def linear_local_size(work_items: int, profile: DeviceProfile, target: int = 128) -> int:
    """Local size for a 1-d launch of ``work_items`` independent items.

    A multiple of the device's preferred multiple (its SIMD width), about ``target`` wide, shrunk
    when there are too few items to give every compute unit a work-group.
    """
    multiple = max(1, profile.preferred_work_group_multiple)
    limit = max(multiple, min(profile.max_work_group_size, profile.max_work_item_sizes[0]))
    size = min(round_up(target, multiple), limit)
    per_unit = round_up(max(1, -(-work_items // max(1, profile.compute_units))), multiple)
    size = max(multiple, min(size, per_unit))
    return min(size, limit)


def reduction_local_size(reduction_numel: int, profile: DeviceProfile, cap: int = 256) -> int:
    """Power-of-two work-group size for a tree reduction over ``reduction_numel`` elements."""
    limit = min(cap, profile.max_work_group_size, profile.max_work_item_sizes[0])
    size = 1
    while size * 2 <= limit and size < reduction_numel:
        size *= 2
    return size
