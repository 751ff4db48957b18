"""float16 and bfloat16: 16-bit storage, float32 arithmetic, rounding where eager rounds.

Stage tests (IR, expression table, rendered kernels) need no device; the device tests compare
with eager PyTorch in the same dtype, exactly where eager's rounding is reproduced op by op and
by the float64 rule elsewhere (ours at most 2x as far from a float64 run as eager).
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_ran_on_device, capture_graphs

import torch_adreno
from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.fusion import fuse
from torch_adreno.kernels import render_program
from torch_adreno.kernels.choices import KernelChoices
from torch_adreno.kernels.expressions import load_text, store_text
from torch_adreno.kernels.writer import Param
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import plan_memory
from torch_adreno.targets import REFERENCE_PROFILE

HALF_DTYPES = [torch.float16, torch.bfloat16]
IR_OF = {torch.float16: ir.DType.F16, torch.bfloat16: ir.DType.BF16}

# -- stage tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_constants_round_to_nearest_even_like_torch(dtype):
    values = [1 / 3, 0.1, -2.5e-8, 1e-5, 65504.0, 65520.0, 70000.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-11,
              1.0 + 3 * 2**-11, 3.3e38, -1e39, float("inf")]
    for v in values:
        expected = float(torch.tensor(v, dtype=torch.float64).to(dtype))
        assert ir.round_to(v, IR_OF[dtype]) == expected, v
        assert ir.const(v, IR_OF[dtype]).value == expected, v
    assert math.isnan(ir.round_to(float("nan"), IR_OF[dtype]))


def test_a_16_bit_op_computes_in_float32_and_rounds_its_result():
    a = ir.Load("a", (ir.index(0),), ir.DType.F16)
    b = ir.Load("b", (ir.index(0),), ir.DType.F16)
    total = ir.call("add", a, b)
    assert total.dtype is ir.DType.F16
    assert isinstance(total, ir.Call) and total.op == "cast"
    (inner,) = total.args
    assert isinstance(inner, ir.Call) and inner.op == "add" and inner.dtype is ir.DType.F32
    # Ops whose result is one of their operands need no rounding.
    assert ir.call("relu", a) == ir.Call("relu", (a,), ir.DType.F16)
    assert ir.call("maximum", a, b).op == "maximum"


def test_loads_and_stores_of_16_bit_buffers():
    assert load_text(ir.DType.F16, "in0", "x") == "vload_half(x, in0)"
    assert store_text(ir.DType.F16, "out0", "x", "v") == "vstore_half_rte((float)(v), x, out0);"
    assert load_text(ir.DType.BF16, "in0", "x") == "adreno_bf16_load(in0[x])"
    assert store_text(ir.DType.BF16, "out0", "x", "v") == "out0[x] = adreno_bf16_bits((float)(v));"
    assert Param("a", "in0", ir.DType.F16, (4,), False).declaration() == "__global const half* restrict in0"
    assert Param("a", "out0", ir.DType.BF16, (4,), True).declaration() == "__global ushort* restrict out0"


def _program(fn, *inputs, index=0):
    gm = capture_graphs(fn, *inputs)[index]
    graph = lower_graph(gm, Config(), "g", None)
    fused = fuse(graph, Config())
    plan = plan_memory(fused, REFERENCE_PROFILE)
    return graph, plan, render_program(fused, plan, REFERENCE_PROFILE)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_fused_chain_rounds_between_ops_and_counts_2_byte_elements(dtype):
    a, b = torch.randn(1000, dtype=dtype), torch.randn(1000, dtype=dtype)
    graph, _, program = _program(lambda a, b: torch.relu(a * b + a), a, b)
    (kernel,) = program.kernels
    rounding = "adreno_round_half(" if dtype == torch.float16 else "adreno_round_bf16("
    # mul rounds its result before add reads it (as eager's two kernels do); relu needs none.
    assert kernel.source.count(rounding) == 2
    if dtype == torch.float16:
        assert kernel.source.count("vload_half(") == 2 and "vstore_half_rte(" in kernel.source
    else:
        assert kernel.source.count("adreno_bf16_load(") == 2 and "adreno_bf16_bits(" in kernel.source
    assert kernel.bytes_read == 2 * 1000 * 2 and kernel.bytes_written == 1000 * 2
    assert all(graph.buffers[n].dtype is IR_OF[dtype] for n in kernel.params)


def test_autocast_casts_fuse_into_their_neighbours():
    x, w, bias = torch.randn(32, 64), torch.randn(16, 64), torch.randn(16)

    def f32(x, w, bias):
        return torch.relu(F.linear(x, w, bias))

    def autocast(x, w, bias):
        with torch.autocast("cpu", dtype=torch.float16):
            return torch.relu(F.linear(x, w, bias)).float()

    gm = capture_graphs(autocast, x, w, bias)[0]
    assert any("_to_copy" in str(n.target) or "convert_element_type" in str(n.target) for n in gm.graph.nodes)
    _, _, program32 = _program(f32, x, w, bias)
    graph, plan, program = _program(autocast, x, w, bias)
    # No kernel and no buffer of their own for the casts of x, w and bias to float16.
    assert len(program.kernels) == len(program32.kernels) == 1
    stored = [n for n in plan.allocations if n not in graph.input_buffers()]
    assert [graph.buffers[n].shape for n in stored] == [(32, 16)]  # the result only
    (gemm,) = program.kernels
    assert "adreno_round_half(" in gemm.source  # operands rounded to float16 as they are loaded


# -- device tests ------------------------------------------------------------------------------


def _as_accurate(ours, eager, reference, what, rtol_atol):
    """Ours matches eager within the dtype's tolerance or is at most 2x as far from float64."""
    rtol, atol = rtol_atol
    if torch.allclose(ours.double(), eager.double(), rtol=rtol, atol=atol, equal_nan=True):
        return
    ours_error = float((ours.double() - reference).abs().max())
    eager_error = float((eager.double() - reference).abs().max())
    assert ours_error <= 2 * eager_error + atol / 10, f"{what}: ours {ours_error:.3g} eager {eager_error:.3g} off"


TOLERANCE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


def _check(fn, inputs, dtype, exact=False):
    """Forward and backward of ``fn`` compiled vs eager, in ``dtype``; returns the profile."""
    def run(f, tensors):
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
        out = f(*leaves)
        weight = torch.linspace(0.5, 1.5, out.numel(), dtype=torch.float64).reshape(out.shape).to(out.dtype)
        grads = torch.autograd.grad((out * weight).sum(), [t for t in leaves if t.requires_grad])
        return out.detach(), [g.detach() for g in grads]

    half = [t.to(dtype) if t.is_floating_point() else t for t in inputs]
    compiled = torch.compile(fn, backend="adreno", fullgraph=True, dynamic=False)
    with torch_adreno.profile() as prof:
        ours = run(compiled, half)
    eager = run(fn, half)
    reference = run(fn, [t.double() if t.is_floating_point() else t for t in half])
    assert prof.kernel_launches > 0 and not prof.host_fallback_ops
    for o, e, r, what in [(ours[0], eager[0], reference[0], "output"),
                          *[(o, e, r, f"gradient {i}") for i, (o, e, r)
                            in enumerate(zip(ours[1], eager[1], reference[1], strict=True))]]:
        assert o.dtype == e.dtype, what
        if exact:
            assert torch.equal(o, e), f"{what}: {(o.double() - e.double()).abs().max()}"
        else:
            _as_accurate(o, e, r, what, TOLERANCE[dtype])
    return prof


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_pointwise_results_are_eagers_bit_for_bit(dtype):
    # Each op computes in float32 and rounds once, as eager's CPU kernels do: fused or not, the
    # results are eager's to the last bit (exp/tanh/... may differ by an ulp of float32 before rounding).
    x, y = torch.randn(3, 257) * 4, torch.randn(3, 257)
    _check(lambda a, b: torch.relu(a * b + a) - b / 3 + torch.where(a > b, a, b * 2), [x, y], dtype, exact=True)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_integer_results_stored_as_16_bit_floats(dtype):
    # A count converted to float16 (nll_loss's total weight: a sum of booleans, int64) is stored
    # by the kernel that computes it: vstore_half_rte has no integer overload (OpInfo's float16
    # nll_loss and cross_entropy samples failed to build on PoCL and NVIDIA).
    t = torch.tensor([1, -100, 3, 4, -100, 7])
    fn = lambda t: ((t != -100).sum().to(dtype), (t * 3).to(dtype), t.to(dtype) / 2)  # noqa: E731
    with torch_adreno.profile() as prof:
        results = torch.compile(fn, backend="adreno")(t)
    assert_ran_on_device(prof)
    for ours, eager in zip(results, fn(t), strict=True):
        assert ours.dtype == dtype and torch.equal(ours, eager)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("fn", [
    lambda x: x.sum(1), lambda x: x.mean((0, 2)), lambda x: x.var(2), lambda x: x.amax(1),
    lambda x: torch.softmax(x, -1), lambda x: F.log_softmax(x, 1),
    lambda x: F.layer_norm(x, (x.shape[-1],)), lambda x: F.gelu(x).sum(-1), lambda x: torch.exp(x).mean(),
], ids=["sum", "mean", "var", "amax", "softmax", "log_softmax", "layer_norm", "gelu_sum", "exp_mean"])
def test_reductions_softmax_and_norms(dtype, fn):
    _check(fn, [torch.randn(4, 33, 130)], dtype)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_gemm_and_convolution_accumulate_in_float32(dtype):
    _check(lambda a, b: a @ b, [torch.randn(70, 300), torch.randn(300, 45)], dtype)
    _check(lambda a, b: torch.bmm(a, b), [torch.randn(3, 20, 64), torch.randn(3, 64, 17)], dtype)
    _check(lambda x, w, b: F.linear(x, w, b), [torch.randn(30, 200), torch.randn(50, 200), torch.randn(50)], dtype)
    _check(lambda x, w, b: F.conv2d(x, w, b, padding=1), [torch.randn(2, 5, 9, 9), torch.randn(7, 5, 3, 3),
                                                           torch.randn(7)], dtype)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_batch_norm_and_pooling(dtype):
    _check(lambda x, w, b: F.max_pool2d(F.batch_norm(x, None, None, w, b, training=True), 2),
           [torch.randn(4, 6, 8, 8), torch.rand(6) + 0.5, torch.randn(6)], dtype)


def test_kernel_bytes_halve_under_float16():
    x = torch.randn(64, 256)

    def f(a):
        return torch.tanh(a) * a

    with torch_adreno.profile() as p32:
        torch.compile(f, backend="adreno")(x)
    torch._dynamo.reset()
    with torch_adreno.profile() as p16:
        torch.compile(f, backend="adreno")(x.half())
    # (0 * 2 == 0: both must have run on the device for the halving to mean anything.)
    assert_ran_on_device(p32)
    assert_ran_on_device(p16)
    assert p32.bytes_kernel_read >= x.numel() * 4 and p32.bytes_kernel_written >= x.numel() * 4
    assert p16.bytes_kernel_read * 2 == p32.bytes_kernel_read
    assert p16.bytes_kernel_written * 2 == p32.bytes_kernel_written


def test_autocast_linear_matches_eager_and_launches_no_cast_kernel():
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))
    x = torch.randn(16, 40)
    for dtype in HALF_DTYPES:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="adreno")
        with torch_adreno.profile() as prof, torch.autocast("cpu", dtype=dtype):
            ours = compiled(x)
        with torch.autocast("cpu", dtype=dtype):
            eager = model(x)
        assert ours.dtype == eager.dtype == dtype
        assert torch.equal(ours, eager)
        names = [k.name for k in prof.kernels]
        # No cast kernel, but the GEMMs ran: a run with no kernels at all launches no cast either.
        assert_ran_on_device(prof)
        assert sum(k.kind == "gemm" for k in prof.kernels) == 2, names
        assert not [n for n in names if re.search(r"_pw__to_copy$|_pw_convert_element_type$", n)], names


def _scaled_steps(forward, model, opt, scaler, x, y, steps):
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(forward(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
    return losses


def test_grad_scaler_in_the_compiled_loop_scales_unscales_and_skips_overflowing_steps():
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    x, y = torch.randn(8, 20) * 100, torch.randint(0, 4, (8,))
    runs = []
    for compiled in (False, True):
        model = make()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        # 2**24 makes the float16 gradients of the first steps overflow: those steps are skipped
        # and the scale halves until the gradients fit.
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
        forward = torch.compile(model, backend="adreno") if compiled else model
        before = [p.detach().clone() for p in model.parameters()]
        with torch_adreno.profile() as prof:
            _scaled_steps(forward, model, opt, scaler, x, y, 1)
        assert scaler.get_scale() == 2.0**23  # the first step overflowed: skipped
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
        losses = _scaled_steps(forward, model, opt, scaler, x, y, 12)
        runs.append((losses, scaler.get_scale(), [p.detach().clone() for p in model.parameters()]))
        if compiled:
            assert prof.kernel_launches > 0 and not prof.host_fallback_ops
    (eager_losses, eager_scale, eager_params), (losses, scale, params) = runs
    assert scale == eager_scale < 2.0**20  # more steps skipped, the same ones as eager's
    assert max(abs(a - b) for a, b in zip(losses, eager_losses, strict=True)) < 1e-2
    assert all(torch.allclose(a, b, atol=1e-3) for a, b in zip(params, eager_params, strict=True))


@pytest.mark.parametrize("zero_copy", [False, pytest.param(True, marks=pytest.mark.unified_memory)])
def test_grad_scaler_unscale_reaches_a_compiled_optimizer_step(zero_copy):
    # GradScaler divides the host's gradients in place without bumping their version counters;
    # with device copies (zero_copy=False, discrete GPUs) the compiled step must still see it.
    options = {"zero_copy": zero_copy}
    x, y = torch.randn(8, 20), torch.randint(0, 4, (8,))
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        forward = model
        if compiled:
            torch._dynamo.reset()
            forward = torch.compile(model, backend="adreno", options=options)
            opt.step = torch.compile(opt.step, backend="adreno", options=options)  # type: ignore[method-assign]
        scaler = torch.amp.GradScaler("cpu")
        with torch_adreno.profile() as prof:
            losses = _scaled_steps(forward, model, opt, scaler, x, y, 3)
        runs.append((losses, scaler.get_scale(), [p.detach().clone() for p in model.parameters()]))
    # The compiled run's forward, backward and optimizer step (an inference graph) ran on the device.
    assert_ran_on_device(prof, graphs=("forward", "backward", "inference"))
    (eager_losses, eager_scale, eager_params), (losses, scale, params) = runs
    assert scale == eager_scale == 2.0**16  # no step overflowed
    assert max(abs(a - b) for a, b in zip(losses, eager_losses, strict=True)) < 1e-2, (losses, eager_losses)
    assert all(torch.allclose(a, b, atol=1e-3) for a, b in zip(params, eager_params, strict=True))


# -- native half arithmetic (cl_khr_fp16) ------------------------------------------------------


def test_native_half_kernels_compute_in_half_registers():
    a, b = torch.randn(1000, dtype=torch.float16), torch.randn(1000, dtype=torch.float16)
    gm = capture_graphs(lambda a, b: torch.relu(a * b + a) * 0.5, a, b)[0]
    graph = lower_graph(gm, Config(), "g", None)
    fused = fuse(graph, Config())
    plan = plan_memory(fused, REFERENCE_PROFILE)
    (native,) = render_program(fused, plan, REFERENCE_PROFILE,
                                 dataclasses.replace(KernelChoices.for_device(REFERENCE_PROFILE), native_half=True)).kernels
    (default,) = render_program(fused, plan, REFERENCE_PROFILE).kernels
    assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in native.source
    assert "#pragma" not in default.source
    body = native.source.split("{", 1)[1]
    # half loads, arithmetic and stores: no float registers, no software rounding, no vload_half
    assert re.search(r"const half t\d+ = in0\[x\];", body)  # (read at the kernel's own element index)
    assert re.search(r"const half t\d+ = \(t\d+ \* t\d+\);", body)
    assert "((half)0.5f)" in body and "out0[x] = (half)(" in body
    assert "float" not in body and "adreno_round_half" not in body and "vload_half" not in body
    assert native.params == default.params and native.bytes_read == default.bytes_read


def test_native_half_is_refused_where_the_device_lacks_cl_khr_fp16():
    from torch_adreno.errors import OptionError
    from torch_adreno.runtime import get_runtime

    assert torch_adreno.config.Config.from_options({"native_half": True}).native_half
    if get_runtime(None).profile.fp16:
        pytest.skip("this device has cl_khr_fp16")
    compiled = torch.compile(lambda a: a * 2, backend="adreno", options={"native_half": True})
    with pytest.raises(Exception, match="cl_khr_fp16") as info:
        compiled(torch.randn(8, dtype=torch.float16))
    inner = getattr(info.value, "inner_exception", info.value)
    assert isinstance(inner, OptionError)
    assert "native_half" in str(inner)


@pytest.mark.parametrize("zero_copy", [pytest.param(True, marks=pytest.mark.unified_memory), False])
def test_training_step_with_grad_scaler_matches_the_eager_scaler_loop(zero_copy):
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    x, y = torch.randn(8, 20) * 100, torch.randint(0, 4, (8,))

    def loss_fn(m, x, y):
        with torch.autocast("cpu", dtype=torch.float16):
            return F.cross_entropy(m(x), y)

    eager_model = make()
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.01, momentum=0.9)
    eager_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=3)
    eager_losses = []
    for _ in range(10):
        eager_opt.zero_grad()
        loss = loss_fn(eager_model, x, y)
        eager_scaler.scale(loss).backward()
        eager_scaler.step(eager_opt)
        eager_scaler.update()
        eager_losses.append(float(loss.detach()))

    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=3)
    step = torch_adreno.TrainingStep(model, loss_fn, opt, options={"zero_copy": zero_copy}, grad_scaler=scaler)
    with torch_adreno.profile() as prof:
        losses = [float(step(x, y)) for _ in range(10)]
    step.synchronize()
    assert step._compiled.scaling is not None and step._compiled.scaling.skipped_steps >= 2  # the first steps overflowed
    assert scaler.get_scale() == eager_scaler.get_scale()
    assert scaler.state_dict()["_growth_tracker"] == eager_scaler.state_dict()["_growth_tracker"]
    assert max(abs(a - b) for a, b in zip(losses, eager_losses, strict=True)) < 1e-2
    for a, b in zip(model.parameters(), eager_model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=2e-3), (a - b).abs().max()
    # Every step ran on the device, not eagerly: its compiled forward (and backward), or a replay
    # of their launches.
    assert_ran_on_device(prof, graphs=("forward", "backward"))
    forwards = [r for r in prof.graph_runs if r.graph.startswith("forward")]
    replays = [s for s in prof.steps if s.kind == "replay" and s.launches > 0]
    assert len(forwards) + len(replays) == len(prof.steps) == 10, [(s.kind, s.launches) for s in prof.steps]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_16_bit_batch_norm_updates_its_16_bit_running_statistics(dtype):
    def make():
        torch.manual_seed(0)
        return torch.nn.BatchNorm2d(6).to(dtype)

    x = torch.randn(4, 6, 5, 5).to(dtype)
    eager, ours = make(), make()
    expected = eager(x)
    with torch_adreno.profile() as prof:
        out = torch.compile(ours, backend="adreno")(x)
    assert_ran_on_device(prof)
    assert out.dtype == expected.dtype == ours.running_mean.dtype == dtype
    _as_accurate(out, expected, make().double()(x.double()), "output", TOLERANCE[dtype])
    for a, b in ((ours.running_mean, eager.running_mean), (ours.running_var, eager.running_var)):
        assert torch.allclose(a.float(), b.float(), rtol=TOLERANCE[dtype][0], atol=1e-3)
