"""Measuring and projecting training steps (``python -m torch_adreno bench``/``project``, and the
scripts in ``benchmarks/``): :mod:`.measure` times a step in eager PyTorch and in the backend's
configurations, :mod:`.suite` runs the fusion-gain suite, :mod:`.projection` projects step times on
an Adreno target from measured bytes and FLOPs. Not a pipeline stage: tools over the public API."""
