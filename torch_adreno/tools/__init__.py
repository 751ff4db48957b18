"""Tools around the product, not part of a compiled step: ``bench`` (the fusion-gain suite, the
projections and their calibration) and ``testing`` (PyTorch's OpInfo and module databases run
through the backend against eager)."""
