"""The compiler: an FX graph of a training step in, fused OpenCL kernels and their memory plan out.

Its stages, each reading the values of the ones before it: ``frontend`` (Dynamo and AOTAutograd's
hand-off, the FX passes, the compile cache) → ``lowering`` (ATen ops to the IR) → ``ir`` (the
loop-level values: buffers, expressions, views) → ``fusion`` (kernels of fused nodes) → ``memory``
(buffer reuse, proven plans) → ``codegen`` (OpenCL text from one expression table and one writer,
and the ``.cl`` templates). The runtime runs what it produces.
"""
