"""How a replayed step is built (:class:`ReplayOptions`, from :class:`~torch_adreno.config.Config`)."""

from __future__ import annotations

from torch_adreno.memory.footprint import MemoryLimits
from torch_adreno.replay.driver_recording import DriverRecording

__all__ = ["ReplayOptions"]


class ReplayOptions:
    """How a replay is built (from :class:`~torch_adreno.config.Config`): ``arena_kernels``
    rebuilds the kernels to take the arena as one argument (False binds them as compiled, to
    sub-buffers of the arena: benchmarks/replay.py measures both, tests check they agree bit for
    bit); ``merge_copies`` does runs of copies between heap regions with one kernel each;
    ``verify_memory`` proves the arena layout against the recorded operations first
    (:func:`~torch_adreno.replay.memory.verify_step_memory`); ``share_memory`` False gives every
    identity made during the step memory of its own; ``limits``: the largest allocation and global
    memory the replay is held to (a target's; None: the present device's); ``fill_uninitialized_memory``:
    the launch list fills each internal identity's bytes where the recording's fills say (before its
    first use, and a graph's slot again before each buffer it holds in turn), so that a read of memory
    nothing wrote in this step shows as NaN or an index error; ``recording``: how the driver records
    the launch list (:func:`~torch_adreno.replay.driver_recording.driver_recording`; None, or one
    of kind None: the C loop enqueues it operation by operation); ``overlap``: return once the loss
    is read where that applies (:mod:`torch_adreno.replay.overlap`)."""

    def __init__(self, arena_kernels: bool = True, merge_copies: bool = True, verify_memory: bool = False,
                 limits: MemoryLimits | None = None, share_memory: bool = True,
                 fill_uninitialized_memory: bool = False, recording: DriverRecording | None = None,
                 overlap: bool = False) -> None:
        self.arena_kernels = arena_kernels
        self.merge_copies = merge_copies
        self.verify_memory = verify_memory
        self.limits = limits
        #: False: every identity made during the step gets memory of its own (a reference replay).
        self.share_memory = share_memory
        self.fill_uninitialized_memory = fill_uninitialized_memory
        self.recording = recording if recording is not None and recording.kind else None
        self.overlap = overlap
