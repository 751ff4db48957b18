"""Errors a user causes are ours and short: each names what was wrong and what to do, in a
traceback of a few frames, not Dynamo's.

- a TrainingStep batch whose dtype, rank or device differs from the steps before and fails:
  a :class:`~torch_adreno.errors.BatchError` naming the argument, what came and what was expected;
- an unknown option to ``torch.compile(..., backend="adreno")``: said at ``torch.compile`` itself,
  with "did you mean", as a TrainingStep says it at construction;
- an op that makes complex values (``torch.fft.rfft``): advice that works for it (no cast of the
  model, no host fallback, which cannot hold its result either);
- an op without a lowering under a TrainingStep: the host fallback written as a TrainingStep option.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import traceback

import pytest
import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.errors import BatchError, OptionError, UnsupportedOpError
from torch_adreno.lowering import _warned_host_ops

#: A traceback this long or longer is Dynamo's, not ours (ours: the user's frame, a few of ours).
SHORT = 24


def _frames(error: BaseException) -> int:
    return len(traceback.extract_tb(error.__traceback__))


def _lines(error: BaseException) -> int:
    return len("".join(traceback.format_exception(error)).splitlines())


def _conv_step() -> tuple[torch_adreno.TrainingStep, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y), opt)
    x, y = torch.randn(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])
    return step, x, y


@pytest.mark.device
def test_a_batch_unlike_the_steps_before_that_fails_is_a_short_batch_error(capfd):
    step, x, y = _conv_step()
    for _ in range(3):
        step(x, y)
    assert step.replayed_steps == 1
    capfd.readouterr()
    cases = [((x.double(), y), "argument 0 is float64 [4, 1, 4, 4] on cpu", "float32 [4, 1, 4, 4] on cpu",
              "argument 0: .to(torch.float32)", "Input type (double) and bias type (float)"),
             ((x.half(), y), "argument 0 is float16", "float32 [4, 1, 4, 4]", "argument 0: .to(torch.float32)",
              "Input type"),
             ((x, y.float()), "argument 1 is float32 [4] on cpu", "int64 [4] on cpu",
              "argument 1: .to(torch.int64)", "gather()"),
             ((x[0], y), "argument 0 is float32 [1, 4, 4]", "float32 [4, 1, 4, 4]", "argument 0: 4 dimensions", ""),
             ((x.to("meta"), y), "argument 0 is float32 [4, 1, 4, 4] on meta", "float32 [4, 1, 4, 4] on cpu",
              'argument 0: .to("cpu")', "")]
    for batch, came, expected, advice, reason in cases:
        with pytest.raises(BatchError) as info:
            step(*batch)
        message = str(info.value)
        assert came in message and f"where the steps before had {expected}" in message and advice in message, message
        assert reason in message, message
        assert _frames(info.value) <= 6 and _lines(info.value) < SHORT, "".join(traceback.format_exception(info.value))
    # Fake tensors' own traceback of the refused meta kernel is held back too.
    assert "failed while attempting to run meta" not in capfd.readouterr().err
    # The step goes on with batches like the earlier ones, replayed.
    before = step.replayed_steps
    step(x, y)
    assert step.replayed_steps == before + 1


@pytest.mark.device
def test_a_batch_that_differs_and_works_is_no_error():
    step, x, y = _conv_step()
    step(x, y)
    loss = step(x[:2], y[:2])  # a partial last batch
    assert torch.isfinite(loss)


def test_an_unknown_option_is_said_at_torch_compile_with_did_you_mean():
    """In a fresh process that never imports torch_adreno: the backend is found by its name."""
    code = textwrap.dedent("""
        import torch
        torch.compile(torch.nn.Linear(2, 2), backend="adreno", options={"fallbak": "host"})
        print("torch.compile returned")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "torch.compile returned" not in result.stdout, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("torch_adreno.errors.OptionError: unknown adreno backend option(s) 'fallbak' "
                                "(did you mean 'fallback'?)"), result.stderr
    assert len(lines) < SHORT and "Set TORCHDYNAMO_VERBOSE" not in result.stderr, result.stderr


def test_an_unknown_option_of_model_compile_is_said_there_too():
    with pytest.raises(OptionError, match=r"'fusoin' \(did you mean 'fusion'\?\)") as info:
        torch.nn.Linear(2, 2).compile(backend="adreno", options={"fusoin": False})
    # Raised at the model's compile, before Dynamo compiles anything: torch.compile's own calls
    # and the check (6 frames here; how torch.compile reaches Dynamo varies with its settings).
    frames = traceback.extract_tb(info.value.__traceback__)
    shown = "".join(traceback.format_exception(info.value))
    assert frames[-1].filename.endswith("torch_patches.py") and len(frames) <= 8, shown
    assert not any("convert_frame" in f.filename or "torch_adreno" in f.filename for f in frames[:-1]), shown


def _spectrum_model() -> torch.nn.Module:
    class Spectrum(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(5, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(torch.fft.rfft(x).abs())  # rfft's complex result

    torch.manual_seed(0)
    return Spectrum()


@pytest.mark.device
@pytest.mark.parametrize("fallback", ["error", "host"])
def test_an_op_making_complex_values_gets_advice_that_works_for_it(fallback):
    compiled = torch.compile(_spectrum_model(), backend="adreno", options={"fallback": fallback})
    with pytest.raises(UnsupportedOpError) as info:
        compiled(torch.randn(3, 8))
    message = str(info.value)
    assert "aten._fft_r2c.default" in message and "makes a torch.complex64 tensor" in message
    assert "torch.fft.rfft(x).abs())  # rfft's complex result" in message, message  # the user's line
    # The model and its input are float32 already; the host fallback cannot hold the result either.
    assert "x.float()" not in message and "'fallback': 'host'" not in message
    assert "@torch.compiler.disable" in message and "cosine and sine" in message
    assert "TORCHDYNAMO_VERBOSE" not in message and _frames(info.value) <= 8


@pytest.mark.device
def test_the_advice_for_complex_values_works():
    @torch.compiler.disable
    def spectrum(x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(x).abs()

    model = _spectrum_model()
    model.forward = lambda x: model.linear(spectrum(x))  # type: ignore[method-assign]
    x = torch.randn(3, 8)
    torch.testing.assert_close(torch.compile(model, backend="adreno")(x), model.linear(spectrum(x)))


def _sorted_loss(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.kthvalue(model(x), 2, 0).values.sum()


@pytest.mark.device
def test_an_op_without_a_lowering_under_a_training_step_advises_the_step_option():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    step = torch_adreno.TrainingStep(model, _sorted_loss, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(UnsupportedOpError) as info:
        step(torch.randn(4, 3))
    message = str(info.value)
    assert "aten.kthvalue.default" in message
    assert ("run this op on the host: torch_adreno.TrainingStep(model, loss_fn, optimizer, "
            "options={'fallback': 'host'})") in message
    assert "torch.compile(" not in message and "TORCHDYNAMO_VERBOSE" not in message
    assert _frames(info.value) <= 5 and _lines(info.value) < SHORT, "".join(traceback.format_exception(info.value))
    # The advice holds: with the option, the step trains.
    before = model.weight.detach().clone()
    with_fallback = torch_adreno.TrainingStep(model, _sorted_loss, torch.optim.SGD(model.parameters(), lr=0.1),
                                              options={"fallback": "host"})
    _warned_host_ops.discard("aten.kthvalue.default")  # (warned once per process: maybe by another test)
    with pytest.warns(UserWarning, match="runs on the host"):
        with_fallback(torch.randn(4, 3))
    with_fallback.synchronize()
    assert not torch.equal(before, model.weight)
