"""The compiled training step exported as ONNX: the checker, the structure Netron shows (our kernels
as function calls), and onnxruntime following our losses for 20 steps under the float32 rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper

import torch_adreno
from torch_adreno.export import ExportError, load_state
from torch_adreno.models import MODELS
from torch_adreno.runner import format as fmt

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.device

STEPS = 20


def _loss_fn(m, x, y):
    return F.cross_entropy(m(x), y)


def _batches(name: str, n: int):
    generator = torch.Generator().manual_seed(1)
    return [MODELS[name].batch(generator) for _ in range(n)]


def captured_step(name: str):
    """A TrainingStep of reference model ``name`` (tensor lr) after its capture, the batches to go on with."""
    torch.manual_seed(0)
    model = MODELS[name].make()
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.05), momentum=0.9)
    step = torch_adreno.TrainingStep(model, _loss_fn, opt)
    batches = _batches(name, STEPS + 2)
    step(*batches[0])
    step(*batches[1])
    assert step.replay is not None
    return step, batches[2:]


def onnxruntime_losses(model: onnx.ModelProto, batches) -> list[float]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    names = [o.name for o in session.get_outputs()]
    losses = []
    for x, y in batches:
        feeds.update(batch_0=x.numpy(), batch_1=y.numpy())
        results = dict(zip(names, session.run(None, feeds), strict=True))
        losses.append(float(results["loss"]))
        feeds.update({k.removesuffix(".new"): v for k, v in results.items() if k.endswith(".new")})
    return losses


def eager_losses(name: str, model: onnx.ModelProto, batches, dtype: torch.dtype) -> list[float]:
    """Eager PyTorch in ``dtype`` from the state the file holds (parameters, momentum, lr)."""
    state = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in model.graph.initializer}
    module = MODELS[name].make().to(dtype)
    with torch.no_grad():
        for key, tensor in module.state_dict(keep_vars=True).items():
            tensor.copy_(state[key])
    opt = torch.optim.SGD(module.parameters(), lr=float(state["lr"]), momentum=0.9)
    for param_name, param in module.named_parameters():
        opt.state[param]["momentum_buffer"] = state[f"optimizer.{param_name}.momentum_buffer"].to(dtype)
    out = []
    for x, y in batches:
        loss = _loss_fn(module, x.to(dtype) if x.is_floating_point() else x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def assert_float32_rule(losses, name, model, batches) -> None:
    """At most twice as far from a float64 run as eager float32 is (Inductor's rule), over the run
    (step by step, eager's error is itself chaotic: it may be near zero at any one step)."""
    reference = np.array(eager_losses(name, model, batches, torch.float64))
    eager = np.abs(np.array(eager_losses(name, model, batches, torch.float32)) - reference)
    ours = np.abs(np.array(losses) - reference)
    assert ours.max() <= 2 * eager.max() + 1e-5, (ours, eager)


def check_structure(model: onnx.ModelProto, step) -> None:
    onnx.checker.check_model(model, full_check=True)
    assert model.producer_name == "torch_adreno" and model.opset_import[0].version >= 18
    functions = {f.name: f for f in model.functions}
    kernels = [n for n in model.graph.node if n.domain == fmt.DOMAIN and n.op_type != fmt.COPY_OP]
    assert len(kernels) == step.replay.kernel_launches
    for node in kernels:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert set(attributes) == set(fmt.KERNEL_ATTRIBUTES)
        source = attributes["opencl_source"].decode()
        assert "__kernel" in source and attributes["kernel_name"].decode() in source
        assert attributes["fx_nodes"] and len(attributes["buffers"]) == len(attributes["parameters"])
        body = functions[node.op_type]
        assert body.domain == fmt.DOMAIN and body.node
        assert all(n.domain in ("", "ai.onnx") for n in body.node)  # standard ops only
    # Outside the kernels, only the views of inputs and outputs.
    assert {n.op_type for n in model.graph.node if n.domain == ""} <= {"Reshape", "Slice", "Gather", "Constant"}
    inputs = [i.name for i in model.graph.input]
    assert inputs[:2] == ["batch_0", "batch_1"] and "lr" in inputs
    assert {t.name for t in model.graph.initializer} == set(inputs[2:])
    outputs = [o.name for o in model.graph.output]
    assert outputs[0] == "loss"
    parameters = [name for name, _ in step.model.named_parameters()]
    assert {f"{p}.new" for p in parameters} <= set(outputs)
    assert {f"optimizer.{p}.momentum_buffer.new" for p in parameters} <= set(outputs)


def test_mlp_step_exports_checks_and_onnxruntime_follows_our_losses(tmp_path) -> None:
    step, batches = captured_step("mlp")
    model = step.export(tmp_path / "step.onnx")
    check_structure(model, step)
    assert onnx.load(str(tmp_path / "step.onnx")).graph.node[0] == model.graph.node[0]
    ours = [step(*b).item() for b in batches]
    assert step.replayed_steps == STEPS
    theirs = onnxruntime_losses(model, batches)
    assert_float32_rule(theirs, "mlp", model, batches)
    assert_float32_rule(ours, "mlp", model, batches)


def test_the_state_written_back_loads_into_the_module(tmp_path) -> None:
    step, _ = captured_step("mlp")
    model = step.export(tmp_path / "step.onnx")
    trained = {t.name: numpy_helper.to_array(t) + 1 for t in model.graph.initializer}
    np.savez(tmp_path / "state.npz", **{k: v for k, v in trained.items() if not k.startswith("captured.")})
    fresh = MODELS["mlp"].make()
    loaded = load_state(fresh, tmp_path / "state.npz")
    assert "fc1.weight" in loaded and "lr" not in loaded
    torch.testing.assert_close(fresh.fc1.weight, torch.from_numpy(trained["fc1.weight"]), rtol=0, atol=0)
    opt = torch.optim.SGD(fresh.parameters(), lr=torch.tensor(0.0), momentum=0.9)
    loaded = load_state(fresh, tmp_path / "state.npz", opt)  # momentum buffers made as a first step would
    assert "lr" in loaded and float(opt.param_groups[0]["lr"]) == float(trained["lr"])
    torch.testing.assert_close(opt.state[fresh.fc1.weight]["momentum_buffer"],
                               torch.from_numpy(trained["optimizer.fc1.weight.momentum_buffer"]), rtol=0, atol=0)
    np.savez(tmp_path / "other.npz", **{"fc9.weight": np.zeros(3, np.float32)})
    with pytest.raises(KeyError, match=r"fc9\.weight"):
        load_state(fresh, tmp_path / "other.npz")


def test_export_before_a_capture_says_what_to_do(tmp_path) -> None:
    model = MODELS["mlp"].make()
    step = torch_adreno.TrainingStep(model, _loss_fn, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ExportError, match="at least twice"):
        step.export(tmp_path / "step.onnx")
    step(*_batches("mlp", 1)[0])
    with pytest.raises(ExportError, match="at least twice"):
        step.export(tmp_path / "step.onnx")


def test_a_capture_is_frozen_and_export_step_takes_only_a_capture(tmp_path) -> None:
    """A CapturedStep keeps the state's values of when it was taken: trained on after, the step's
    parameters move, the capture's export does not; a TrainingStep passed to export_step is refused,
    naming the method that gives its capture."""
    from torch_adreno.export import CapturedStep, export_step

    step, batches = captured_step("mlp")
    captured = step.captured_step()
    assert isinstance(captured, CapturedStep) and captured.forward is None
    assert captured.loss_shape == () and captured.loss_dtype == torch.float32
    names = set(captured.state_names.values())
    assert {"fc1.weight", "lr"} <= names
    scalars = {captured.state_names[i] for i in captured.scalar_inputs}
    assert "lr" in scalars and not any(n.startswith("fc") for n in scalars)
    at_capture = {k: v.detach().clone() for k, v in step.model.state_dict().items()}
    for batch in batches[:3]:
        step(*batch)
    assert step.replayed_steps == 3
    step.synchronize()
    assert not torch.equal(step.model.fc1.weight, at_capture["fc1.weight"])
    model = export_step(captured, tmp_path / "frozen.onnx")
    written = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for name, value in at_capture.items():
        np.testing.assert_array_equal(written[name], value.numpy())
    with pytest.raises(TypeError, match=r"CapturedStep, not a TrainingStep: .*step\.captured_step\(predict=None\)"):
        export_step(step, tmp_path / "step.onnx")  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        captured.loss_shape = (1,)  # type: ignore[misc]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lenet", "resnet_mini", "transformer"])
def test_reference_models_export_and_onnxruntime_follows_20_steps(name, tmp_path) -> None:
    step, batches = captured_step(name)
    model = step.export(tmp_path / "step.onnx")
    check_structure(model, step)
    ours = [step(*b).item() for b in batches]
    theirs = onnxruntime_losses(model, batches)
    assert_float32_rule(theirs, name, model, batches)
    assert_float32_rule(ours, name, model, batches)


@pytest.mark.device
def test_an_adam_steps_state_loads_into_a_fresh_optimizer(tmp_path):
    """The step reads the learning rate and betas as tensors: the file holds them (named), and a
    fresh optimizer holding them as numbers loads them as numbers, with Adam's 0-dim step counts."""
    import torch.nn.functional as F

    from torch_adreno.export import load_state

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.02, betas=(0.8, 0.95))
    step = torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y), opt)
    x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
    for _ in range(3):
        step(x, y)
    exported = step.export(str(tmp_path / "adam.onnx"))
    names = {i.name for i in exported.graph.input}
    assert {"lr", "optimizer.group0.betas.0", "optimizer.group0.betas.1"} <= names
    step.close()
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.5)
    load_state(fresh, tmp_path / "adam.onnx", fresh_opt)
    assert fresh_opt.param_groups[0]["lr"] == pytest.approx(0.02) and fresh_opt.param_groups[0]["betas"] == \
        pytest.approx((0.8, 0.95))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True))
    assert all(float(s["step"]) == 3 for s in fresh_opt.state.values())
