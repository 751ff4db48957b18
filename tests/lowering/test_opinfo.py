"""PyTorch's own OpInfo samples through the backend (a bounded subset; the full sweep is
``python -m torch_adreno opinfo``, see README). A sample fails the test only when it fails and is
not listed, with its reason, in ``torch_adreno.tools.testing.opinfo.EXPECTED_FAILURES``."""

from __future__ import annotations

import warnings

import pytest

from torch_adreno.tools.testing import opinfo

#: One or two OpInfo entries per op family the backend claims; the first samples of each.
CI_SUBSET = [
    "add", "mul", "div.no_rounding_mode", "exp", "tanh", "sigmoid", "clamp", "where", "pow",
    "sum", "mean", "amax", "var", "argmax", "cumsum",
    "mm", "bmm", "addmm", "nn.functional.linear",
    "nn.functional.conv2d", "nn.functional.conv_transpose2d", "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
    "softmax", "log_softmax", "nn.functional.cross_entropy",
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.group_norm",
    "nn.functional.gelu", "nn.functional.silu", "nn.functional.embedding",
    "nn.functional.scaled_dot_product_attention",
    "cat", "stack", "gather", "scatter", "index_select", "transpose", "flip",
    "topk", "sort", "histc", "scatter_reduce.amax", "linalg.vector_norm",
]
SAMPLES_PER_OP = 2


def test_subset_names_are_claimed_opinfo_entries():
    claimed = {opinfo._opinfo_name(op) for op in opinfo.claimed_opinfos()}
    missing = [name for name in CI_SUBSET if name not in claimed]
    assert not missing, f"not claimed OpInfo entries: {missing}"


def test_expected_failures_name_claimed_entries_and_give_reasons():
    claimed = {opinfo._opinfo_name(op) for op in opinfo.claimed_opinfos()}
    for (name, _index), reason in opinfo.EXPECTED_FAILURES.items():
        assert name in claimed, f"expected failure for an unclaimed entry: {name}"
        assert len(reason) > 10, f"{name}: an expected failure needs a reason"


def test_a_mismatch_passes_only_when_as_accurate_as_eager_against_float64():
    import torch

    exact = torch.tensor([1.0, 0.0], dtype=torch.float64)
    eager = torch.tensor([1.0, 4e-5])
    close_to_exact = torch.tensor([1.0, -4e-5])
    note = opinfo._compare(close_to_exact, eager, lambda: exact, "output 0")
    assert "as accurate as eager" in note
    assert opinfo._compare(eager, eager, lambda: exact, "output 0") == ""
    with pytest.raises(AssertionError, match=r"vs float64 ours is 0\.0002 off, eager 4e-05"):
        opinfo._compare(torch.tensor([1.0, 2e-4]), eager, lambda: exact, "output 0")
    with pytest.raises(AssertionError, match="not close"):  # no float64 form: the float32 rule stands
        opinfo._compare(close_to_exact, eager, lambda: 1 / 0, "output 0")


@pytest.mark.device
@pytest.mark.parametrize("name", CI_SUBSET)
def test_opinfo_samples_match_eager(name):
    reports = opinfo.sweep([name], limit=SAMPLES_PER_OP, progress=False)
    assert reports, f"no OpInfo entry named {name}"
    unexpected = [f"[{o.index}] {o.reason}" for r in reports for o in r.unexpected]
    assert not unexpected, "\n".join(unexpected)
    assert any(o.passed for r in reports for o in r.outcomes), "no sample passed"


#: OpInfo entries whose error inputs and dtype cases CI runs: the matrix products, the ops whose
#: meta functions check less than eager's kernels, decomposed ops and indexing.
ERROR_SUBSET = ["mm", "addmm", "nn.functional.linear", "index_put", "softmax", "nn.functional.layer_norm",
                "nn.functional.gelu", "var", "nn.functional.nll_loss", "gather", "scatter", "scatter_add",
                "nn.functional.adaptive_avg_pool2d", "cat"]


def test_known_disagreements_name_claimed_entries_and_give_reasons():
    from torch_adreno.tools.testing.opinfo_errors import KNOWN_DISAGREEMENTS

    claimed = {opinfo._opinfo_name(op) for op in opinfo.claimed_opinfos()}
    for (name, _case), reason in KNOWN_DISAGREEMENTS.items():
        assert name in claimed and len(reason) > 10, name


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("name", ERROR_SUBSET)
def test_refuses_what_eager_refuses(name):
    """OpInfo's error inputs and mixed-dtype operands: where eager raises, ours raises the same
    exception type (never a value); where eager computes, ours matches it or refuses clearly."""
    from torch_adreno.tools.testing.opinfo_errors import error_sweep

    outcomes = [o for report in error_sweep([name]) for o in report]
    assert outcomes, f"no error or dtype case for {name}"
    unexpected = [f"{o.case}: {o.kind}: {o.detail}" for o in outcomes if not o.agrees and not o.known]
    assert not unexpected, "\n".join(unexpected)


#: Entries outside the claimed ops: every
#: sample must pass or end in a clear error, never an internal error or a wrong result.
DATABASE_SUBSET = ["masked.sum", "masked.softmax", "masked.cumsum", "masked.median", "gather", "tensor_split",
                   "take", "nonzero", "linalg.det", "nn.functional.pixel_shuffle"]


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("name", DATABASE_SUBSET)
def test_database_entries_pass_or_fail_clearly(name):
    """A sample with no graph compiled for the device is no pass: where Dynamo handed the backend
    graphs it is an internal error (the values are not ours), and where Dynamo captured none it
    is counted apart, reported, and a failure for the entries we claim."""
    reports = opinfo.sweep([name], limit=4, progress=False, database=True)
    assert reports, f"no OpInfo entry named {name}"
    outcomes = [(r.op, o) for r in reports for o in r.outcomes]
    bad = [f"{op}[{o.index}] {o.kind}: {o.reason}" for op, o in outcomes
           if o.kind in (opinfo.INTERNAL_ERROR, opinfo.WRONG_RESULT)]
    claimed = {opinfo._opinfo_name(op) for op in opinfo.claimed_opinfos()}
    no_graph = [f"{op}[{o.index}]" for op, o in outcomes if o.kind == opinfo.NO_GRAPH]
    if no_graph:
        warnings.warn(f"{name}: no graph reached the backend in {len(no_graph)} samples: {', '.join(no_graph)}",
                      stacklevel=1)
    bad += [f"{sample} {opinfo.NO_GRAPH}: a claimed entry's sample never reached the backend" for sample in no_graph
            if sample.split("[")[0] in claimed]
    assert not bad, "\n".join(bad)
    reached = [o for _, o in outcomes if o.kind not in (opinfo.SKIPPED, opinfo.NO_GRAPH)]
    assert reached, "no sample reached the backend (every one skipped or without a graph)"


# -- the error sweep's classification: no internal error passes for eager's ------------------------


def _mm_case(monkeypatch, raise_in_compile=None):
    """``run_case`` of mm with an int64 left operand (eager raises RuntimeError; fake tensors do
    not), the backend's compile made to raise ``raise_in_compile()`` where given."""
    import types

    import torch

    from torch_adreno.frontend import pipeline
    from torch_adreno.tools.testing.opinfo_errors import _Sample, run_case

    if raise_in_compile is not None:
        def failing(*args, **kwargs):
            raise raise_in_compile()

        monkeypatch.setattr(pipeline, "compile_graph", failing)
    monkeypatch.setenv("TORCH_ADRENO_COMPILE_CACHE", "0")
    op = types.SimpleNamespace(name="mm", variant_test_name="", op=torch.mm)
    return run_case(op, "test", _Sample(torch.arange(4).reshape(2, 2), (torch.randn(2, 2),), {}))


@pytest.mark.device
def test_our_own_eager_error_agrees_with_eagers(monkeypatch):
    """The lowering's check raises eager's type with eager's message: agreement."""
    from torch_adreno.tools.testing.opinfo_errors import SAME_ERROR

    outcome = _mm_case(monkeypatch)
    assert outcome.kind == SAME_ERROR and "expected m1 and m2 to have the same dtype" in outcome.detail, outcome
    assert "FX node 'mm'" in outcome.detail, outcome  # raised by the lowering, not by eager's kernel


@pytest.mark.device
def test_eagers_error_from_a_graph_not_compiled_for_the_device_is_no_agreement(monkeypatch):
    """The graph handed back to run eagerly raises eager's very error, with eager's message: it
    still is not ours."""
    from torch_adreno.tools.testing.opinfo_errors import NOT_ON_DEVICE

    monkeypatch.setattr("torch_adreno.frontend.pipeline.compile_graph", lambda gm, *args, **kwargs: gm)
    outcome = _mm_case(monkeypatch)
    assert outcome.kind == NOT_ON_DEVICE and not outcome.agrees, outcome


@pytest.mark.device
@pytest.mark.parametrize("error", ["kernel_build", "pyopencl", "plain_runtime_error", "wrong_message"])
def test_internal_errors_and_other_messages_never_count_as_eagers(monkeypatch, error):
    """Eager raises RuntimeError; each of these is a RuntimeError (or wraps one) that the type
    check alone accepted: a kernel build failure, a pyopencl error, a RuntimeError of the
    backend's own (BackendCompilerFailed), eager's type with another message."""
    import pyopencl as cl

    from torch_adreno.errors import KernelBuildError
    from torch_adreno.lowering.checks import eager_error_type
    from torch_adreno.runtime import get_runtime
    from torch_adreno.tools.testing.opinfo_errors import INTERNAL, OTHER_ERROR

    def pyopencl_error():
        try:
            cl.Program(get_runtime().context, "__kernel void broken(").build()
        except cl.Error as err:
            return err
        raise AssertionError("the broken program built")

    raising = {"kernel_build": lambda: KernelBuildError("kernel k failed to build"),
               "pyopencl": pyopencl_error,
               "plain_runtime_error": lambda: RuntimeError("expected m1 and m2 to have the same dtype"),
               "wrong_message": lambda: eager_error_type(RuntimeError)("not eager's message")}[error]
    outcome = _mm_case(monkeypatch, raising)
    assert outcome.kind == (OTHER_ERROR if error == "wrong_message" else INTERNAL), outcome
    assert not outcome.agrees


@pytest.mark.device
def test_a_result_not_computed_on_the_device_is_no_agreement(monkeypatch):
    """Where eager computes, eager's values from a graph that never reached the device (the
    backend handing the graph back) do not count as ours."""
    import types

    import torch

    from torch_adreno.frontend import pipeline
    from torch_adreno.tools.testing.opinfo_errors import NOT_ON_DEVICE, SAME_RESULT, _Sample, run_case

    op = types.SimpleNamespace(name="mm", variant_test_name="", op=torch.mm)
    sample = _Sample(torch.randn(2, 3), (torch.randn(3, 2),), {})
    assert run_case(op, "test", sample).kind == SAME_RESULT
    monkeypatch.setenv("TORCH_ADRENO_COMPILE_CACHE", "0")
    monkeypatch.setattr(pipeline, "compile_graph", lambda gm, *args, **kwargs: gm)  # the FX graph, run eagerly
    assert run_case(op, "test", sample).kind == NOT_ON_DEVICE
