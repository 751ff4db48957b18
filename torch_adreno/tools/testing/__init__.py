"""Test harnesses shipped with the package (used by tests/ and ``python -m torch_adreno opinfo``):
PyTorch's OpInfo samples through the backend (:mod:`.opinfo`) and its error inputs
(:mod:`.opinfo_errors`). They need ``expecttest`` (the ``test`` extra), as PyTorch's OpInfo
database does."""
