"""Work-group (local) size selection: a cheap heuristic from device properties and global size,
and the alternatives a tuner may time against it.

Mobile GPUs lose up to a third of their speed to badly chosen work-group sizes, so no kernel is
launched with a NULL local size: the driver's choice is not trusted. The heuristic is what every
launch uses unless tuning (``options={"tune": True}``) measured something better on the device.
"""

from __future__ import annotations

from typing import NamedTuple

from torch_adreno.targets import DeviceProfile

#: The widest group a tree reduction gets by default (a power of two).
REDUCTION_CAP = 256
#: Tuning tries sizes from a quarter to four times the heuristic's: the heuristic is assumed to be
#: near the optimum, and every extra size costs a launch (and, on PoCL, a work-group compile).
CANDIDATE_SPAN = 4
#: No tuning candidate is wider than this: it is the largest group the GPUs we target accept
#: (Adreno, NVIDIA), and a tree reduction's local arrays grow with the group.
MAX_CANDIDATE_GROUP = 1024


class Launch(NamedTuple):
    """One launch geometry of a kernel: the ``-D`` template options that depend on it (replacing the
    kernel's own of the same names), global size and local size."""

    defines: tuple[str, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def group_limit(profile: DeviceProfile) -> int:
    """The widest 1-d group the device accepts."""
    return max(1, min(profile.max_work_group_size, profile.max_work_item_sizes[0]))


def linear_local_size(work_items: int, profile: DeviceProfile, target: int = 128) -> int:
    """Local size for a 1-d launch of ``work_items`` independent items.

    A multiple of the device's preferred multiple (its SIMD width), about ``target`` wide, shrunk
    when there are too few items to give every compute unit a work-group.
    """
    multiple = max(1, profile.preferred_work_group_multiple)
    limit = max(multiple, group_limit(profile))
    size = min(round_up(target, multiple), limit)
    per_unit = round_up(max(1, -(-work_items // max(1, profile.compute_units))), multiple)
    size = max(multiple, min(size, per_unit))
    return min(size, limit)


def reduction_local_size(reduction_numel: int, profile: DeviceProfile, cap: int = REDUCTION_CAP) -> int:
    """Power-of-two work-group size for a tree reduction over ``reduction_numel`` elements."""
    limit = min(cap, group_limit(profile))
    size = 1
    while size * 2 <= limit and size < reduction_numel:
        size *= 2
    return size


def candidate_span(default: int) -> list[int]:
    """``default`` times 1/4, 1/2, 2 and 4 (:data:`CANDIDATE_SPAN`), the default first; callers
    drop the sizes their kernel cannot take."""
    sizes = [default]
    factor = 1
    while factor < CANDIDATE_SPAN:
        factor *= 2
        sizes += [default * factor, default // factor]
    return sizes


def guarded_linear_candidates(global_size: int, default: int, profile: DeviceProfile) -> list[Launch]:
    """Launches a tuner may try for a 1-d kernel that returns early past its last item (so the
    global size may be rounded up to any local size), the default ``(global_size, default)`` first.

    Local sizes are multiples of the preferred multiple, no wider than the device allows nor than
    the global size rounded up to that multiple (a wider group only adds idle items).
    """
    multiple = max(1, profile.preferred_work_group_multiple)
    limit = min(group_limit(profile), MAX_CANDIDATE_GROUP, round_up(max(global_size, 1), multiple))
    sizes = [default]
    for size in candidate_span(default)[1:]:
        size = round_up(max(size, 1), multiple)
        if size <= limit and size not in sizes:
            sizes.append(size)
    return [Launch((), (global_size,), (default,))] + [
        Launch((), (round_up(global_size, size),), (size,)) for size in sizes[1:]]


def reduction_local_candidates(default: int, profile: DeviceProfile) -> list[int]:
    """Power-of-two group sizes a tuner may try for a tree reduction, default first.

    Wider than the default only where the default hit :data:`REDUCTION_CAP` (otherwise it already
    covers the whole reduced row and a wider group only adds idle items).
    """
    limit = min(group_limit(profile), MAX_CANDIDATE_GROUP)
    if default < min(REDUCTION_CAP, limit):
        limit = default
    sizes = [default]
    for size in candidate_span(default)[1:]:
        if 1 <= size <= limit and size not in sizes:
            sizes.append(size)
    return sizes
