"""``native_half=True`` for real, on a device with ``cl_khr_fp16`` (Intel's CPU runtime,
which the test extra installs on x86-64 Linux): float16 kernels computing in ``half`` registers
build, run and meet the float16 accuracy rule, on OpInfo float16 samples and in a training loop.

The rule: within about one float16 ulp of eager float16, or at most 2x as far from a float64 run
as eager float16 is (OpInfo samples: :mod:`torch_adreno.tools.testing.opinfo`'s; the loop: its loss curve)."""

from __future__ import annotations

import os
import platform

import pytest
import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.runtime.device import list_devices
from torch_adreno.tools.testing.opinfo import claimed_opinfos, run_sample, samples

pytestmark = pytest.mark.device

#: Pointwise-heavy ops (native half changes pointwise kernels only) and reductions around them.
NATIVE_HALF_OPS = ("add", "sub", "mul", "div", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid",
                   "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "where", "clamp",
                   "maximum", "pow", "sum", "mean")


def fp16_device() -> int:
    """The index of the first working device with cl_khr_fp16; skipped without one, except in CI on
    x86-64 Linux, where the test extra's Intel runtime must provide it."""
    for entry in list_devices():
        if entry.unusable is None and "cl_khr_fp16" in entry.device.extensions.split():
            return entry.index
    if os.environ.get("CI") == "true" and platform.machine() == "x86_64" and platform.system() == "Linux":
        pytest.fail("no OpenCL device with cl_khr_fp16: the test extra's intel-opencl-rt should give one")
    pytest.skip("no OpenCL device with cl_khr_fp16 here")


class _WithSources(torch_adreno.profile):
    """A profile that also keeps the source of each launched kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def on_launch(self, record) -> None:
        super().on_launch(record)
        self.sources.append(record.kernel.source)


def _native_launches(profile: _WithSources) -> int:
    """Launches of kernels computing in half registers (the cl_khr_fp16 pragma is theirs alone)."""
    return sum("cl_khr_fp16 : enable" in source for source in profile.sources)


@pytest.mark.parametrize("name", NATIVE_HALF_OPS)
def test_opinfo_float16_samples_pass_with_native_half(name: str) -> None:
    device = fp16_device()
    ops = [op for op in claimed_opinfos(torch.float16) if op.name == name]
    if not ops:
        pytest.fail(f"{name} has no claimed OpInfo entry with float16 samples on the CPU")
    outcomes = []
    with _WithSources() as prof:
        for op in ops:
            for index, sample in samples(op, 3, dtype=torch.float16):
                outcomes.append(run_sample(op, index, sample, options={"native_half": True, "device": device},
                                           dtype=torch.float16))
    counted = [o for o in outcomes if not o.skipped]
    assert counted, f"{name}: no float16 sample ran"
    failed = [f"{o.op}[{o.index}]: {o.reason}" for o in counted if not o.passed and not o.expected]
    assert not failed, failed
    assert _native_launches(prof) > 0, f"{name}: no kernel computing in half registers ran"


class _HalfMLP(torch.nn.Module):
    """Linear layers with LayerNorm, GELU and a gated residual between them: pointwise and
    reduction kernels of their own (a GEMM's epilogue does not compute in half registers)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.norm, self.out = torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.norm(self.inner(x)))
        return self.out(h + h * torch.sigmoid(h.mean(dim=1, keepdim=True)))


def _train(native: bool | None, steps: int = 12) -> list[float]:
    """SGD on a small float16 MLP (the model in float16, as `.half()` users train it); None: eager.
    The float64 run is the same model in float64."""
    torch.manual_seed(0)
    model = _HalfMLP()
    dtype = torch.float64 if native == "float64" else torch.float16
    model = model.to(dtype)
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 32, generator=generator).to(dtype), torch.randint(0, 10, (16,), generator=generator))
            for _ in range(4)]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    forward = model
    if isinstance(native, bool):
        torch._dynamo.reset()
        forward = torch.compile(model, backend="adreno", options={"native_half": native, "device": fp16_device()})
    losses = []
    for i in range(steps):
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss = F.cross_entropy(forward(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def test_a_float16_training_loop_with_native_half_meets_the_float16_rule() -> None:
    fp16_device()
    exact = _train("float64")  # type: ignore[arg-type]
    eager = _train(None)
    with _WithSources() as prof:
        native = _train(True)
    assert _native_launches(prof) > 0
    def distance(losses: list[float]) -> float:
        return max(abs(a - b) for a, b in zip(losses, exact, strict=True))

    assert distance(native) <= 2 * distance(eager) + 2e-3, (native, eager, exact)
    assert native[-1] < native[0]  # it trains
