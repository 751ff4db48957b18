"""torch_adreno.runner: an exported step trained without PyTorch (in processes where importing torch
fails), bit for bit as the in-PyTorch replay; files and devices it cannot run refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import helper

import torch_adreno
from torch_adreno.models import MODELS, LeNet
from torch_adreno.runner import UnsupportedStepFile, check_device, choose_device, integrity, read_step
from torch_adreno.runner import format as fmt

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = '''
import sys

class BlockTorch:
    """Importing torch fails here, as where it is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, BlockTorch())
'''


def without_torch(tmp_path: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """``python *args`` in a process where ``import torch`` fails (a sitecustomize on PYTHONPATH)."""
    blocker = tmp_path / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in [str(blocker), str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def _loss_fn(m, x, y):
    return F.cross_entropy(m(x), y)


RUN_BATCHES = textwrap.dedent('''
    import json, sys
    import numpy as np
    from torch_adreno.runner import StepRunner
    assert "torch" not in sys.modules
    runner = StepRunner.load(sys.argv[1])
    data = np.load(sys.argv[2])
    losses = [runner.step(data[f"x{i}"], data[f"y{i}"]) for i in range(int(sys.argv[3]))]
    runner.save_state(sys.argv[4])
    assert "torch" not in sys.modules
    print(json.dumps(losses))
''')


def _replay_and_runner(tmp_path: Path, step, batches) -> tuple[list[float], list[float]]:
    step.export(tmp_path / "step.onnx")
    np.savez(tmp_path / "batches.npz", **{f"x{i}": x.numpy() for i, (x, _) in enumerate(batches)},
             **{f"y{i}": y.numpy() for i, (_, y) in enumerate(batches)})
    (tmp_path / "run.py").write_text(RUN_BATCHES)
    replays_before = step.replayed_steps
    ours = [step(*b).item() for b in batches]
    assert step.replayed_steps - replays_before == len(batches)  # the in-PyTorch replay, every step
    done = without_torch(tmp_path, "run.py", "step.onnx", "batches.npz", str(len(batches)), "state.npz")
    assert done.returncode == 0, done.stderr[-3000:]
    return ours, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.device
def test_runner_without_torch_reproduces_the_replay_bit_for_bit(tmp_path) -> None:
    torch.manual_seed(0)
    model = MODELS["mlp"].make()
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.05), momentum=0.9)
    step = torch_adreno.TrainingStep(model, _loss_fn, opt)
    generator = torch.Generator().manual_seed(2)
    batches = [MODELS["mlp"].batch(generator) for _ in range(12)]
    step(*batches[0])
    step(*batches[1])
    ours, theirs = _replay_and_runner(tmp_path, step, batches[2:])
    assert ours == theirs  # bit for bit
    # The state it wrote is the replay's, and loads into the module.
    step.synchronize()
    fresh = MODELS["mlp"].make()
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=torch.tensor(0.0), momentum=0.9)
    torch_adreno.export.load_state(fresh, tmp_path / "state.npz", fresh_opt)
    for (name, trained), (_, loaded) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(trained.detach(), loaded.detach()), name
    assert torch.equal(opt.state[model.fc1.weight]["momentum_buffer"], fresh_opt.state[fresh.fc1.weight]["momentum_buffer"])


@pytest.mark.device
@pytest.mark.slow
def test_digits_demo_exported_by_the_cli_trains_in_the_runner_cli_without_torch(tmp_path) -> None:
    from torch_adreno.cli import main

    assert main(["export", str(tmp_path / "digits.onnx"), "--model", "digits", "--data", str(tmp_path / "digits.npz"),
                 "--lr", "0.05"]) == 0
    done = without_torch(tmp_path, "-m", "torch_adreno.runner", "digits.onnx", "--data", "digits.npz", "--steps", "30",
                         "--out", "trained.npz")
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 30 and np.mean(losses[-5:]) < np.mean(losses[:5])  # it learns
    assert "accuracy" in done.stdout
    model = LeNet()
    assert "conv1.weight" in torch_adreno.export.load_state(model, tmp_path / "trained.npz")


def test_the_package_imports_without_torch_and_names_what_needs_it(tmp_path) -> None:
    done = without_torch(tmp_path, "-c", "import torch_adreno, torch_adreno.runner\n"
                         "try:\n    torch_adreno.TrainingStep\nexcept ImportError as e:\n    print(e)")
    assert done.returncode == 0, done.stderr
    assert "needs PyTorch" in done.stdout and "torch_adreno.runner" in done.stdout


# -- files and devices it cannot run --------------------------------------------------------------

SOURCE = "__kernel void k0(__global float* restrict out0) { out0[get_global_id(0)] = 1.0f; }"


def _minimal_step(**overrides) -> onnx.ModelProto:
    """A torch_adreno step file of one kernel writing a constant (built by hand, no device)."""
    attributes = dict(kernel_name="k0", opencl_source=SOURCE, build_options=[""], global_size=[4], local_size=[4],
                      buffers=[0], parameters=["buf0"], fx_nodes=["full"], graph="forward_0", index_checks=0,
                      extensions=[""])
    attributes.update(overrides)
    attributes = {k: v for k, v in attributes.items() if v is not None}
    function = helper.make_function(fmt.DOMAIN, "k0", [], ["out_buf0"], [helper.make_node(
        "Constant", [], ["out_buf0"], value=onnx.numpy_helper.from_array(np.ones(4, np.float32)))],
        [helper.make_opsetid("", fmt.OPSET)], attributes=list(fmt.KERNEL_ATTRIBUTES))
    graph = helper.make_graph([helper.make_node("k0", [], ["loss"], domain=fmt.DOMAIN, **attributes)], "step", [],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, functions=[function], producer_name=fmt.PRODUCER,
                              opset_imports=[helper.make_opsetid("", fmt.OPSET), helper.make_opsetid(fmt.DOMAIN, 1)])
    plan = {"identities": [{"index": 0, "kind": "internal", "nbytes": 16, "slot": 0}], "slots": [16], "batch": [],
            "loss": {"identity": 0, "dtype": "float32", "shape": []}}
    helper.set_model_props(model, {fmt.FORMAT_KEY: str(fmt.FORMAT_VERSION), fmt.PLAN_KEY: json.dumps(plan)})
    return integrity.seal(model)


def test_the_minimal_file_is_read() -> None:
    plan, operations = read_step(_minimal_step())
    assert [op.name for op in operations] == ["k0"] and plan["slots"] == [16]  # type: ignore[union-attr]


def test_a_file_of_another_producer_is_refused_naming_it() -> None:
    model = _minimal_step()
    model.producer_name = "pytorch"
    with pytest.raises(UnsupportedStepFile, match="made by pytorch, not by torch_adreno"):
        read_step(model)


def test_another_format_version_is_refused() -> None:
    model = _minimal_step()
    helper.set_model_props(model, {fmt.FORMAT_KEY: "99", fmt.PLAN_KEY: "{}"})
    with pytest.raises(UnsupportedStepFile, match=f"step format 99; this runner reads format {fmt.FORMAT_VERSION}"):
        read_step(model)


def test_unknown_and_missing_kernel_attributes_are_named() -> None:
    with pytest.raises(UnsupportedStepFile, match="does not know: tiling"):
        read_step(_minimal_step(tiling=[8, 8]))
    with pytest.raises(UnsupportedStepFile, match="no attribute local_size"):
        read_step(_minimal_step(local_size=None))


def test_a_standard_op_between_kernels_is_refused() -> None:
    model = _minimal_step()
    model.graph.node.append(helper.make_node("Relu", ["loss"], ["relu"]))
    with pytest.raises(UnsupportedStepFile, match="standard Relu between kernels"):
        read_step(model)


@pytest.mark.device
def test_a_device_without_what_the_kernels_need_is_refused_naming_it() -> None:
    device = choose_device()
    plan, operations = read_step(_minimal_step())
    check_device(device, plan, operations)  # the minimal step itself runs
    too_wide = device.max_work_group_size * 2
    plan, operations = read_step(_minimal_step(global_size=[too_wide], local_size=[too_wide]))
    with pytest.raises(UnsupportedStepFile, match=f"work-groups of {too_wide} items"):
        check_device(device, plan, operations)
    # (the extensions a kernel enables are data of its node: the runner parses no source)
    source = "#pragma OPENCL EXTENSION cl_vendor_imaginary : enable\n" + SOURCE
    plan, operations = read_step(_minimal_step(opencl_source=source, extensions=["cl_vendor_imaginary"]))
    with pytest.raises(UnsupportedStepFile, match="needs the OpenCL extension cl_vendor_imaginary"):
        check_device(device, plan, operations)
