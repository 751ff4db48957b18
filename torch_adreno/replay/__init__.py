"""One training step's device work, recorded once and replayed.

- :mod:`.capture`: the recording (launches and copies over memory identities);
- :mod:`.memory`: where the step's own memory lives in a replay (one plan for the whole step, the arena);
- :mod:`.step`: :class:`~torch_adreno.replay.step.ReplayedStep`, the replay;
- :mod:`.launch_list`: the enqueue loops (Python, and a small C loop).
"""
