"""One training step's device work, recorded once and replayed.

- :mod:`.capture`: the recording (launches and copies over memory identities);
- :mod:`.memory`: where the step's own memory lives in a replay (one plan for the whole step, the arena);
- :mod:`.operations`: the step's operations with every kernel argument bound once;
- :mod:`.step`: :class:`~torch_adreno.replay.step.ReplayedStep`, the replay, built in three stages:
  :mod:`.step_memory` (its memory planned and held to the limits), :mod:`.bound_step` (bound to the
  device) and :mod:`.step_launches` (its launch lists, with the overlap); :mod:`.options` says how;
- :mod:`.launch_list`: the enqueue loops (Python, and a small C loop, :mod:`.native_loop`);
- :mod:`.driver_recording`: the list recorded once into the driver (a ``cl_khr_command_buffer``);
- :mod:`.overlap`: a step that returns once its loss is read, the next batch landing meanwhile.
"""
