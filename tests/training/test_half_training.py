"""Training in half precision: float16 autocast with GradScaler, bfloat16 autocast, an all-float16
model; the loss curve at most 2x as far from a float64 run as eager's own run in that precision.

Every run starts from the same weights and cycles through the same batches (tests/half_training.py).
The 50-step runs of all four models are ``benchmarks/precision_training.py``; CI runs mlp and
lenet for 50 steps and resnet_mini and transformer for fewer (each test bounded).
"""

from __future__ import annotations

import pytest
from half_training import PRECISIONS, STORAGE_TYPE, distance, train

#: (model, steps): CI's bound per test.
CASES = [("mlp", 50), ("lenet", 50), pytest.param("resnet_mini", 12, marks=pytest.mark.slow),
         pytest.param("transformer", 20, marks=pytest.mark.slow)]


def _check(model: str, precision: str, steps: int) -> None:
    """The rule below is one-sided: a run that computed in float32 on the device, or ran eagerly
    on the host, would be as close to float64 as it likes. So the compiled run must also have run
    on the device, and stored 16-bit values there: its forward and backward kernels read and
    wrote buffers of the 16-bit type (an all-16-bit model: no float32 buffer at all)."""
    reference = train(model, "float64", steps, compiled=False)
    eager = train(model, precision, steps, compiled=False)
    ours = train(model, precision, steps, compiled=True)
    assert ours.host_fallback_ops == 0
    assert ours.kernel_launches >= steps, f"{ours.kernel_launches} kernel launches in {steps} steps"
    autocast, params, _ = PRECISIONS[precision]
    sixteen = STORAGE_TYPE[autocast or params]
    for kind in ("forward", "backward"):
        for direction in ("read", "write"):
            types = ours.storage.get((kind, direction), set())
            assert sixteen in types, f"{model} {precision}: no {sixteen} buffer {direction} in the {kind}: {types}"
    if params in STORAGE_TYPE:
        floats = {key: types for key, types in ours.storage.items() if "float" in types}
        assert not floats, f"{model} {precision}: float32 buffers in an all-{params} model: {floats}"
    assert ours.skipped_steps == eager.skipped_steps
    ours_distance, eager_distance = distance(ours.losses, reference.losses), distance(eager.losses, reference.losses)
    assert ours_distance <= 2 * eager_distance, (
        f"{model} {precision}: loss curve {ours_distance:.3g} from float64's, eager's {eager_distance:.3g}")
    assert ours.losses[-1] < ours.losses[0]


@pytest.mark.parametrize(("model", "steps"), CASES)
def test_float16_autocast_with_grad_scaler(model, steps):
    _check(model, "fp16_autocast", steps)


@pytest.mark.parametrize(("model", "steps"), CASES)
def test_bfloat16_autocast(model, steps):
    _check(model, "bf16_autocast", steps)


def test_all_float16_mlp():
    _check("mlp", "half", 50)
