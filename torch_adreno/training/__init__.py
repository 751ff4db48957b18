"""The training step on the device: :class:`~torch_adreno.training.step.TrainingStep` and what it
is made of.

- :mod:`.step`: the step itself (compile, first calls, capture, replay, state on the device);
- :mod:`.guards`: what a replay assumes, checked before each replay;
- :mod:`.gradients`, :mod:`.scaler`: gradients kept on the device (clipping, loss scaling);
- :mod:`.state`: the step's tensors in the user's words;
- :mod:`.host_sync`: host copies made current on first touch between steps;
- :mod:`.replay`: capture of one step's device work and its replay.

This package's ``__init__`` imports nothing: the stages after training (the ONNX export) import
its leaf modules, and :mod:`.step` imports the export for :meth:`TrainingStep.export`.
"""
