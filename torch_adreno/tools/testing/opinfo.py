"""PyTorch's own OpInfo samples through the backend: material we did not write, per claimed op.

For every ATen op the lowering registry claims, the OpInfo entries of ``op_db`` that exercise it
(matched by ATen name, plus the ``nn.functional`` entries that lower to the claimed op) run their
float32 samples compiled with ``backend="adreno"`` — forward, and backward where the op supports
autograd — and are compared with eager PyTorch. Dynamo is reset between samples (its recompile
limit would otherwise send later samples to eager silently) and every sample must have compiled
at least one graph through the backend, or it does not count as a pass.

``dtype=torch.float16`` / ``bfloat16`` (``--dtype``) sweeps the claimed entries whose OpInfo
lists that dtype on the CPU, with their samples of that dtype (backward where OpInfo supports it
in that dtype), compared with eager in the same dtype: within about one unit in the last place,
or at most 2x as far as eager from a float64 run of the sample.

    python -m torch_adreno opinfo                 # the full sweep: pass/fail counts per op
    python -m torch_adreno opinfo --ops add mm --samples 3
    python -m torch_adreno opinfo --dtype float16 --failures
"""

from __future__ import annotations

import contextlib
import functools
import math
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyopencl as cl
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from torch_adreno.errors import AdrenoError, KernelBuildError, UnsupportedOpError
from torch_adreno.frontend.compile_cache import CompiledGraph
from torch_adreno.runtime import Executable

#: float32 comparison used for every sample (OpInfo's per-op overrides target other backends);
#: our reductions and GEMMs reassociate sums, hence more than assert_close's float32 default.
RTOL, ATOL = 1e-4, 1e-5

#: Sweep dtypes and the tolerance (rtol, atol) within which ours simply matches eager's: float32's
#: above, and about one unit in the last place of the 16-bit types (torch.testing's defaults).
SWEEP_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOLERANCES = {torch.float32: (RTOL, ATOL), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}

#: Where ours and eager differ by more than RTOL/ATOL, both are measured against a float64 run of
#: the same sample: ours passes if its largest error is at most this many times eager float32's
#: own (plus ATOL / 10), the rule Inductor's accuracy checker applies with its float64 reference.
#: Saturated softmaxes and cancelling sums make two float32 summation orders differ by more than
#: ATOL while both are equally far from the exact result.
FLOAT64_ERROR_MULTIPLIER = 2.0

#: OpInfo entries that reach claimed ATen ops through decomposition (name, or name.variant for one
#: variant only -> claimed op).
FUNCTIONAL = {
    "nn.functional.conv1d": "convolution", "nn.functional.conv2d": "convolution",
    "nn.functional.linear": "addmm", "nn.functional.embedding": "embedding",
    "nn.functional.max_pool2d": "max_pool2d_with_indices", "nn.functional.relu": "relu",
    "nn.functional.softmax": "amax", "nn.functional.log_softmax": "amax", "softmax": "amax",
    "log_softmax": "amax", "nn.functional.cross_entropy": "gather", "nn.functional.nll_loss": "gather",
    "nn.functional.layer_norm": "var_mean", "nn.functional.batch_norm": "var_mean",
    "nn.functional.gelu": "erf", "nn.functional.silu": "sigmoid", "nn.functional.mse_loss": "mean",
    "nn.functional.hardtanh": "clamp", "nn.functional.relu6": "clamp", "nn.functional.leaky_relu": "where",
    "nn.functional.elu": "expm1", "nn.functional.hardswish": "clamp", "nn.functional.hardsigmoid": "clamp",
    "nn.functional.binary_cross_entropy_with_logits": "log1p", "nn.functional.dropout": "mul",
    "to": "_to_copy", "nn.functional.threshold": "where", "chunk": "split_with_sizes",
    "nn.functional.avg_pool2d": "avg_pool2d", "nn.functional.adaptive_avg_pool2d": "_adaptive_avg_pool2d",
    "nn.functional.adaptive_max_pool2d": "adaptive_max_pool2d", "nn.functional.conv_transpose1d": "convolution",
    "nn.functional.conv_transpose2d": "convolution", "nn.functional.group_norm": "var_mean",
    "native_group_norm": "var_mean", "nn.functional.instance_norm": "var_mean",
    "nn.functional.scaled_dot_product_attention": "bmm", "nn.functional.softplus": "log1p",
    "nn.functional.mish": "tanh", "nn.functional.huber_loss": "where", "nn.functional.smooth_l1_loss": "where",
    "nn.functional.l1_loss": "abs", "nn.functional.softsign": "abs", "nn.functional.logsigmoid": "log1p",
    "nn.functional.adaptive_avg_pool1d": "_adaptive_avg_pool2d", "nn.functional.adaptive_max_pool1d":
    "adaptive_max_pool2d", "nn.functional.avg_pool1d": "avg_pool2d", "nn.functional.conv_transpose3d": "convolution",
    "nn.functional.pad.constant": "constant_pad_nd", "argsort": "sort", "msort": "sort",
    "index_add": "index_put", "linalg.vector_norm": "sum", "norm": "sum",
}

#: Random ops: our generator is Philox on the device, not eager's, so their samples cannot be
#: compared value for value; tests/lowering/test_random.py checks their distributions, repeatability under
#: torch.manual_seed, and that dropout's backward uses its forward's mask.
RANDOM_OPINFOS = frozenset({"bernoulli", "rand_like", "randn", "randn_like", "nn.functional.dropout", "normal",
                            "uniform", "randint", "randint_like", "multinomial"})

#: Entries whose ``op`` wraps the function in torch's RNG-state freezing (for their random
#: samples), which Dynamo cannot trace: the function itself is compiled instead.
UNWRAPPED: dict[str, Any] = {
    "nn.functional.scaled_dot_product_attention": torch.nn.functional.scaled_dot_product_attention,
}

#: Samples known to fail, with the reason: (OpInfo name, sample index or None for all) -> reason.
FLOAT64_OUT_OF_SCOPE = "out of scope: the sample produces float64 (the backend computes float32 only)"
OTHER_DEVICE_OUT_OF_SCOPE = "out of scope: the sample makes its result on another device"
EXPECTED_FAILURES: dict[tuple[str, int | None], str] = {
    ("norm.nuc", None): "the nuclear norm is a sum of singular values: an SVD, which has no lowering (a clear error)",
    ("nn.functional.conv_transpose3d", 8): (
        "weight gradient 2.4e-5 off (atol 1e-5) on values from cancellation of terms up to 165: vs float64 "
        "ours is 7e-5, eager float32 2e-5 off: summation order"),
    ("nn.functional.conv_transpose3d", 9): "as sample 8: summation order in a cancelling weight gradient",
    **{("index_put", i): (
        "boolean-mask index with a tensor of values: which value lands where depends on the mask's data "
        "(a prefix count of True entries); not lowered yet, raises UnsupportedOpError naming it") for i in (1, 3)},
}

#: Known failures of the 16-bit sweeps (``--dtype float16`` / ``bfloat16``), by dtype, with reasons.
#: None of them is about 16-bit arithmetic: the same samples fail alike in float32.
_DTYPE_INDEPENDENT: dict[tuple[str, int | None], str] = {
    **{("index_put", i): "as in float32: boolean-mask index with a tensor of values (data-dependent placement)"
       for i in (1, 3)},
    **{("new_empty_strided", i): ("as in float32: an uninitialised tensor with non-contiguous strides, refused "
                                  "with a LoweringError (only contiguous strides are supported)") for i in (2, 3, 5)},
    ("empty_strided", None): "as in float32: Dynamo cannot trace the sample (pybind11 constructor), under any backend",
}
#: 16-bit samples with equal values among those sorted or selected: the values match eager's, the
#: indices of equal values do not (ours: by position, as ``sort(stable=True)``; eager's unstable sort
#: and topk: as its C++ library's introselect leaves them, which nothing specifies).
_TIES = ("equal values (a 16-bit sample of random numbers has many): values as eager's; the indices of equal "
         "values by position (stable), eager's as its unstable C++ selection leaves them")
HALF_EXPECTED_FAILURES: dict[torch.dtype, dict[tuple[str, int | None], str]] = {
    torch.float16: {**_DTYPE_INDEPENDENT, ("sort", 0): _TIES, ("argsort", 0): _TIES},
    torch.bfloat16: {**_DTYPE_INDEPENDENT, ("sort", 0): _TIES, ("argsort", 0): _TIES,
                     **{("topk", i): _TIES for i in range(1, 7)}},
}


#: What became of a sample (``Outcome.kind``). A *clear error* is one of ours (an AdrenoError
#: naming the op or FX node and saying how to proceed); *not traceable* is Dynamo refusing the
#: function before any graph reaches a backend (its own clear error, the same under any backend);
#: an *internal error* is anything else raised while compiling or running, or graphs Dynamo handed
#: the backend that were not compiled for the device (the sample's values are then eager's): a
#: bug to fix. *No graph*: the sample ran and Dynamo captured no graph at all (nothing reached
#: any backend): never a pass, and reported apart.
PASS, CLEAR_ERROR, NOT_TRACEABLE, INTERNAL_ERROR, WRONG_RESULT, NO_GRAPH, SKIPPED = (
    "pass", "clear error", "not traceable", "internal error", "wrong result", "no graph", "skipped")
KINDS = (PASS, CLEAR_ERROR, NOT_TRACEABLE, INTERNAL_ERROR, WRONG_RESULT, NO_GRAPH, SKIPPED)


@dataclass
class Outcome:
    """One sample's result. ``expected`` marks a failure listed in :data:`EXPECTED_FAILURES`: it
    still counts as a failure in the pass rate, it just is not a surprise."""

    op: str
    index: int
    passed: bool
    reason: str = ""
    expected: bool = False
    #: The sample is invalid in eager too: it is not counted either way.
    skipped: bool = False
    #: One of :data:`KINDS`.
    kind: str = PASS

    def __post_init__(self) -> None:
        if self.skipped:
            self.kind = SKIPPED
        elif not self.passed and self.kind == PASS:
            self.kind = INTERNAL_ERROR


@dataclass
class OpReport:
    op: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def counted(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.skipped]

    @property
    def passed(self) -> int:
        return sum(o.passed for o in self.counted)

    @property
    def failed(self) -> int:
        return sum(not o.passed for o in self.counted)

    @property
    def unexpected(self) -> list[Outcome]:
        return [o for o in self.counted if not o.passed and not o.expected]


def _opinfo_name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def claimed_opinfos(dtype: torch.dtype = torch.float32) -> list[Any]:
    """The op_db entries exercising ops the lowering registry claims, with ``dtype`` samples on the CPU."""
    from torch.testing._internal.common_methods_invocations import op_db

    from torch_adreno.lowering import supported_ops

    claimed = {s.split(".")[1] for s in supported_ops() if s.startswith(("aten.", "prims."))}
    chosen = []
    for op in op_db:
        target = FUNCTIONAL.get(_opinfo_name(op), FUNCTIONAL.get(op.name, op.aten_name))
        if target in claimed and op.name not in RANDOM_OPINFOS and dtype in op.supported_dtypes("cpu"):
            chosen.append(op)
    return chosen


def database_opinfos() -> list[Any]:
    """Every op_db entry with float32 samples on the CPU, claimed or not (see ``sweep(database=True)``)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


@contextlib.contextmanager
def _count_compiles() -> Iterator[list[int]]:
    """Counts graphs bound to the device, compiled now or loaded from the compile cache."""
    count = [0]
    original = CompiledGraph.bind

    def counting(graph: CompiledGraph) -> Executable:
        count[0] += graph.executable is None
        return original(graph)

    CompiledGraph.bind = counting  # type: ignore[method-assign,assignment]
    try:
        yield count
    finally:
        CompiledGraph.bind = original  # type: ignore[method-assign]


def _leaves(value: Any) -> list[Any]:
    return tree_flatten(value)[0]


def _grads(out: Any, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    total = None
    for i, o in enumerate(_leaves(out)):
        if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point() and o.numel():
            w = torch.linspace(0.5, 1.5, o.numel()).reshape(o.shape) * (i + 1)
            term = (o * w).sum()
            total = term if total is None else total + term
    if total is None:
        return []
    return list(torch.autograd.grad(total, inputs, allow_unused=True))


def run_sample(op: Any, index: int, sample: Any, options: dict[str, Any] | None = None,
               dtype: torch.dtype = torch.float32) -> Outcome:
    """One sample (of ``dtype``), compiled vs eager; the reason says what failed."""
    name = _opinfo_name(op)
    failures = EXPECTED_FAILURES if dtype == torch.float32 else HALF_EXPECTED_FAILURES.get(dtype, {})
    expected = failures.get((name, index)) or failures.get((name, None))
    function = UNWRAPPED.get(name, op.op)
    if name in UNWRAPPED and sample.kwargs.get("dropout_p", 0.0):
        return Outcome(name, index, False, "random (dropout_p > 0): see RANDOM_OPINFOS", skipped=True)
    flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
    tensors = [flat[i] for i in slots]

    def call(*ts: torch.Tensor) -> Any:
        values = list(flat)
        for slot, t in zip(slots, ts, strict=True):
            values[slot] = t
        inp, args, kwargs = tree_unflatten(values, spec)
        return function(inp, *args, **kwargs)

    def prepared() -> list[torch.Tensor]:
        return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]

    grad = op.supports_autograd and any(t.requires_grad for t in tensors)
    if name in RANDOM_OPINFOS or op.name in RANDOM_OPINFOS:
        return _run_random(name, index, call, prepared, grad, options)
    torch._dynamo.reset()
    try:
        eager_inputs = prepared()
        expected_out = call(*eager_inputs)
        diff = [t for t in eager_inputs if t.requires_grad]
        expected_grads = _grads(expected_out, diff) if grad and diff else []
    except Exception as err:  # the sample is not valid in eager either: not ours to judge
        return Outcome(name, index, False, f"eager raises {type(err).__name__}", skipped=True)
    if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in _leaves(expected_out)):
        # A float32 sample asking for a float64 result (to(float64), softmax(dtype=float64)): the
        # backend computes float32 only (Adreno GPUs have no float64) and raises a LoweringError
        # naming the node, which tests/lowering/test_lowering.py checks; these are reported apart.
        return Outcome(name, index, False, FLOAT64_OUT_OF_SCOPE, skipped=True)
    elsewhere = {str(t.device) for t in _leaves(expected_out) if isinstance(t, torch.Tensor) and t.device.type != "cpu"}
    if elsewhere:
        # *_like samples ask for device="cuda" where CUDA exists: a result on another device is
        # not the backend's to make (lowering raises a LoweringError saying so, tested).
        return Outcome(name, index, False, f"{OTHER_DEVICE_OUT_OF_SCOPE} ({', '.join(sorted(elsewhere))})",
                       skipped=True)
    compiled = torch.compile(call, backend="adreno", options=options or {}, fullgraph=True, dynamic=False)
    captured = _dynamo_graphs()
    try:
        with _count_compiles() as compiles:
            ours_inputs = prepared()
            out = compiled(*ours_inputs)
            diff = [t for t in ours_inputs if t.requires_grad]
            grads = _grads(out, diff) if grad and diff else []
    except Exception as err:
        result = _failure(name, index, err)
    else:
        if not compiles[0]:
            result = _not_compiled(name, index, _dynamo_graphs() - captured)
        else:
            result = _judge(name, index, compiles[0], call, tensors, grad, (out, grads),
                            (expected_out, expected_grads), dtype)
    if expected is not None and not result.passed:
        result.expected, result.reason = True, f"expected failure ({expected}): {result.reason}"
    return result


def _run_random(name: str, index: int, call: Callable[..., Any], prepared: Callable[[], list[torch.Tensor]],
                grad: bool, options: dict[str, Any] | None) -> Outcome:
    """A random op's sample: compiled and run (an exception is classified as any other), but its
    values are not compared with eager's generator: skipped as far as the counts go."""
    torch._dynamo.reset()
    try:
        call(*prepared())
    except Exception as err:
        return Outcome(name, index, False, f"eager raises {type(err).__name__}", skipped=True)
    try:
        inputs = prepared()
        out = torch.compile(call, backend="adreno", options=options or {}, fullgraph=True, dynamic=False)(*inputs)
        diff = [t for t in inputs if t.requires_grad]
        if grad and diff:
            _grads(out, diff)
    except Exception as err:
        return _failure(name, index, err)
    return Outcome(name, index, False, "random: ran, values not compared (see RANDOM_OPINFOS)", skipped=True)


def _causes(err: BaseException) -> Iterator[BaseException]:
    """``err`` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _dynamo_graphs() -> int:
    """Graphs Dynamo has captured (and handed a backend) in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _not_compiled(name: str, index: int, captured: int) -> Outcome:
    """A sample that ran without any graph compiled for the device: an internal error where
    Dynamo handed the backend ``captured`` graphs (they ran some other way), else no graph."""
    if captured:
        return Outcome(name, index, False, f"Dynamo handed the backend {captured} graph(s) and none was compiled "
                                           "for the device: the results are not the device's", kind=INTERNAL_ERROR)
    return Outcome(name, index, False, "no graph reached the backend (Dynamo captured none)", kind=NO_GRAPH)


def _failure(name: str, index: int, err: BaseException) -> Outcome:
    """Classify an exception raised compiling or running a sample (see :data:`KINDS`)."""
    inner = err.inner_exception if isinstance(err, torch._dynamo.exc.BackendCompilerFailed) else err
    build = next((e for e in _causes(inner) if isinstance(e, (KernelBuildError, cl.Error))), None)
    if build is not None:  # a kernel we generated that the device refused, or another OpenCL failure: a bug
        return Outcome(name, index, False, f"{type(build).__name__}: " + " ".join(str(build).split())[:200],
                       kind=INTERNAL_ERROR)
    if isinstance(inner, UnsupportedOpError):
        return Outcome(name, index, False, "unsupported: " + str(inner).split("\n")[0], kind=CLEAR_ERROR)
    if isinstance(inner, AdrenoError):
        return Outcome(name, index, False, f"{type(inner).__name__}: " + str(inner).split("\n")[0], kind=CLEAR_ERROR)
    if isinstance(inner, torch._dynamo.exc.TorchDynamoException) and not isinstance(
            err, torch._dynamo.exc.BackendCompilerFailed):
        # Dynamo refused or failed while tracing, before a graph reached any backend (the same
        # under aot_eager): Unsupported, fake-tensor errors, data-dependent output shapes.
        return Outcome(name, index, False, f"Dynamo: {type(inner).__name__}: " + " ".join(str(inner).split())[:200],
                       kind=NOT_TRACEABLE)
    frames = traceback.extract_tb(inner.__traceback__)
    where = next((f"{f.filename.split('/')[-1]}:{f.lineno}" for f in reversed(frames)
                  if "torch_adreno" in f.filename), "")
    return Outcome(name, index, False, f"{type(inner).__name__} {where}: " + " ".join(str(inner).split())[:200],
                   kind=INTERNAL_ERROR)


def _judge(name: str, index: int, compiles: int, call: Callable[..., Any], tensors: Sequence[torch.Tensor],
           grad: bool, ours: tuple[Any, list[Any]], eager: tuple[Any, list[Any]],
           dtype: torch.dtype = torch.float32) -> Outcome:
    """Compare a compiled run's outputs and gradients with eager's (see :func:`_compare`)."""
    (out, grads), (expected_out, expected_grads) = ours, eager
    if compiles == 0:
        return _not_compiled(name, index, 0)
    exact = _Float64Reference(call, tensors, grad, dtype)
    tolerance = TOLERANCES[dtype]
    notes = []
    try:
        ours_leaves, eager_leaves = _leaves(out), _leaves(expected_out)
        assert len(ours_leaves) == len(eager_leaves), f"{len(ours_leaves)} outputs, eager {len(eager_leaves)}"
        for i, (a, b) in enumerate(zip(ours_leaves, eager_leaves, strict=True)):
            if isinstance(b, torch.Tensor):
                notes.append(_compare(a, b, functools.partial(exact.output, i), f"output {i}", tolerance))
            elif isinstance(b, float) and math.isnan(b):
                assert isinstance(a, float) and math.isnan(a), (a, b)
            else:
                assert a == b, (a, b)
        assert len(grads) == len(expected_grads), f"{len(grads)} gradients, eager {len(expected_grads)}"
        for i, (a, b) in enumerate(zip(grads, expected_grads, strict=True)):
            if b is not None:
                assert a is not None, f"gradient {i}: eager has one, ours is None"
                notes.append(_compare(a, b, functools.partial(exact.grad, i), f"gradient {i}", tolerance))
    except AssertionError as err:
        return Outcome(name, index, False, "mismatch: " + " ".join(str(err).split())[:200], kind=WRONG_RESULT)
    return Outcome(name, index, True, "; ".join(n for n in notes if n))


class _Float64Reference:
    """The sample run eagerly in float64 (its tensors of the sweep's dtype promoted), computed on first use."""

    def __init__(self, call: Callable[..., Any], tensors: Sequence[torch.Tensor], grad: bool,
                 dtype: torch.dtype = torch.float32) -> None:
        self._call, self._tensors, self._grad, self._dtype = call, tensors, grad, dtype
        self._result: tuple[list[Any], list[Any]] | None = None

    def _run(self) -> tuple[list[Any], list[Any]]:
        if self._result is None:
            inputs = [(t.detach().double() if t.dtype in (torch.float32, self._dtype) else t.detach().clone())
                      .requires_grad_(t.requires_grad) for t in self._tensors]
            out = self._call(*inputs)
            diff = [t for t in inputs if t.requires_grad]
            self._result = (_leaves(out), _grads(out, diff) if self._grad and diff else [])
        return self._result

    def output(self, i: int) -> Any:
        return self._run()[0][i]

    def grad(self, i: int) -> Any:
        return self._run()[1][i]


def _compare(ours: torch.Tensor, eager: torch.Tensor, exact: Callable[[], Any], what: str,
             tolerance: tuple[float, float] = (RTOL, ATOL)) -> str:
    """Assert ``ours`` matches ``eager`` (``tolerance``: rtol, atol), or is as accurate as eager
    against float64 (see :data:`FLOAT64_ERROR_MULTIPLIER`); returns a note when the second rule decided."""
    rtol, atol = tolerance
    try:
        torch.testing.assert_close(ours, eager, rtol=rtol, atol=atol, equal_nan=True)
        return ""
    except AssertionError as mismatch:
        try:
            reference = exact()
        except Exception:  # no float64 form of this sample: the float32 comparison stands
            raise mismatch from None
        finite = all(bool(torch.isfinite(t).all()) for t in (ours, eager, reference)
                     if isinstance(t, torch.Tensor) and t.is_floating_point())
        if not (isinstance(reference, torch.Tensor) and reference.shape == eager.shape and finite):
            raise
        ours_error = float((ours.double() - reference.double()).abs().max())
        eager_error = float((eager.double() - reference.double()).abs().max())
        if ours_error <= FLOAT64_ERROR_MULTIPLIER * eager_error + atol / 10:
            return f"{what} as accurate as eager vs float64 (ours {ours_error:.2g}, eager {eager_error:.2g})"
        raise AssertionError(f"{what}: vs float64 ours is {ours_error:.2g} off, eager {eager_error:.2g}; "
                             f"{mismatch}") from None


#: Entries whose samples enumerate a large parameter grid (1,440 each): the sweep takes every n-th
#: sample, spread over the whole grid, unless asked for all of them.
SAMPLE_STRIDE = {"nn.functional.max_pool2d": 12, "max_pool2d_with_indices_backward": 12}


def samples(op: Any, limit: int | None, all_samples: bool = False,
            dtype: torch.dtype = torch.float32) -> Iterator[tuple[int, Any]]:
    """``(index, sample)`` of ``op``'s ``dtype`` samples: the first ``limit`` taken, and of the
    entries in :data:`SAMPLE_STRIDE` every n-th unless ``all_samples``."""
    stride = 1 if all_samples else SAMPLE_STRIDE.get(_opinfo_name(op), 1)
    # (16-bit backward: an op's OpInfo may support the dtype forward only)
    backward = op.supports_autograd and (dtype == torch.float32 or dtype in op.supported_backward_dtypes("cpu"))
    generated = op.sample_inputs("cpu", dtype, requires_grad=backward)
    taken = 0
    for index, sample in enumerate(generated):
        if limit is not None and taken >= limit:
            return
        if index % stride == 0:
            taken += 1
            yield index, sample


def sweep(names: Sequence[str] | None = None, limit: int | None = None, progress: bool = True,
          shard: tuple[int, int] = (0, 1), on_report: Callable[[OpReport], None] | None = None,
          all_samples: bool = False, database: bool = False, dtype: torch.dtype = torch.float32,
          options: dict[str, Any] | None = None) -> list[OpReport]:
    """Run the ``dtype`` samples of every claimed OpInfo (or of ``names``); ``limit`` samples per op,
    each compiled with the backend ``options`` (the device among them).

    ``database`` takes every op_db entry instead of the claimed ones: ops without a lowering must
    then end in a clear error (UnsupportedOpError naming the op), never an internal one.

    ``shard=(i, n)`` runs every n-th op from the i-th, so that n processes share a sweep;
    ``on_report`` sees each op's report as soon as it is complete (a sweep cut short keeps them).
    """
    from tqdm import tqdm

    ops = [op for op in (database_opinfos() if database else claimed_opinfos(dtype)) if names is None or op.name in names or _opinfo_name(op) in names]
    ops = ops[shard[0]::shard[1]]
    reports = []
    for op in tqdm(ops, desc="OpInfo sweep", unit="op", disable=not progress):
        report = OpReport(_opinfo_name(op))
        for index, sample in samples(op, limit, all_samples, dtype):
            report.outcomes.append(run_sample(op, index, sample, options, dtype=dtype))
        reports.append(report)
        if on_report is not None:
            on_report(report)
    return reports


def format_reports(reports: Sequence[OpReport]) -> str:
    """Per OpInfo entry: passes, expected failures, unexpected failures, the first failure's reason."""
    lines = [f"{'op':<40} {'pass':>5} {'xfail':>5} {'fail':>5}  first failure"]
    for r in reports:
        first = next((o.reason for o in r.counted if not o.passed), "")
        xfail = r.failed - len(r.unexpected)
        lines.append(f"{r.op:<40} {r.passed:>5} {xfail:>5} {len(r.unexpected):>5}  {first[:110]}")
    passed = sum(r.passed for r in reports)
    total = sum(len(r.counted) for r in reports)
    unexpected = sum(len(r.unexpected) for r in reports)
    skipped = [o for r in reports for o in r.outcomes if o.skipped]
    float64 = sum(o.reason == FLOAT64_OUT_OF_SCOPE for o in skipped)
    other_device = sum(o.reason.startswith(OTHER_DEVICE_OUT_OF_SCOPE) for o in skipped)
    lines.append(f"total: {passed}/{total} samples pass ({100 * passed / max(total, 1):.1f}%) over {len(reports)} "
                 f"OpInfo entries; {total - passed - unexpected} expected failures, {unexpected} unexpected; "
                 f"not counted: {float64} samples producing float64, {other_device} on another device, "
                 f"{len(skipped) - float64 - other_device} invalid in eager too")
    kinds = {kind: sum(o.kind == kind for r in reports for o in r.outcomes) for kind in KINDS}
    lines.append("by kind: " + ", ".join(f"{kind} {n}" for kind, n in kinds.items()))
    return "\n".join(lines)
