"""PyTorch's own OpInfo samples through the backend (a bounded subset; the full sweep is
``python -m torch_adreno opinfo``, see README). A sample fails the test only when it fails and is
not listed, with its reason, in ``torch_adreno.opinfo.EXPECTED_FAILURES``."""

from __future__ import annotations

import pytest

from torch_adreno import opinfo

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
    from torch_adreno.opinfo_errors import KNOWN_DISAGREEMENTS

    claimed = {opinfo._opinfo_name(op) for op in opinfo.claimed_opinfos()}
    for (name, _case), reason in KNOWN_DISAGREEMENTS.items():
        assert name in claimed and len(reason) > 10, name


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("name", ERROR_SUBSET)
def test_refuses_what_eager_refuses(name):
    """OpInfo's error inputs and mixed-dtype operands: where eager raises, ours raises the same
    exception type (never a value); where eager computes, ours matches it or refuses clearly."""
    from torch_adreno.opinfo_errors import error_sweep

    outcomes = [o for report in error_sweep([name]) for o in report]
    assert outcomes, f"no error or dtype case for {name}"
    unexpected = [f"{o.case}: {o.kind}: {o.detail}" for o in outcomes if not o.agrees and not o.known]
    assert not unexpected, "\n".join(unexpected)


#: Entries outside the claimed ops (and the ones issue 13 found stopping on internal errors): every
#: sample must pass or end in a clear error, never an internal error or a wrong result.
DATABASE_SUBSET = ["masked.sum", "masked.softmax", "masked.cumsum", "masked.median", "gather", "tensor_split",
                   "take", "nonzero", "linalg.det", "nn.functional.pixel_shuffle"]


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("name", DATABASE_SUBSET)
def test_database_entries_pass_or_fail_clearly(name):
    reports = opinfo.sweep([name], limit=4, progress=False, database=True)
    assert reports, f"no OpInfo entry named {name}"
    bad = [f"[{o.index}] {o.kind}: {o.reason}" for r in reports for o in r.outcomes
           if o.kind in (opinfo.INTERNAL_ERROR, opinfo.WRONG_RESULT)]
    assert not bad, "\n".join(bad)
    assert any(o.kind != opinfo.SKIPPED for r in reports for o in r.outcomes), "every sample was skipped"
