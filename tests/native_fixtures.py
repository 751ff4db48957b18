"""Fixtures of the native runtime's tests (test_native_step.py, test_remote.py), a plugin of
conftest.py: its builds, the environment that runs them on pip's OpenCL drivers, the CPU runtimes
present, exported steps; and a hand-made step file. Builds and exports are made once per session."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from conftest import in_ci
from onnx import helper

from torch_adreno.cli import main as cli_main
from torch_adreno.cli.native import NativeBuild, NativeBuildError, build_native, opencl_environment
from torch_adreno.runner import format as fmt
from torch_adreno.runner import integrity

ROOT = Path(__file__).resolve().parents[1]
#: Batches in each exported data file; runs take them in turn.
STEPS = 6
#: The CPU runtimes of CI, by the platform names both runners match.
PLATFORMS = ("Intel(R) OpenCL", "Portable Computing Language")
#: Leaks included: what the OpenCL drivers keep until exit is suppressed by library (a leak of the
#: runtime's own has no frame in a driver).
SANITIZER_OPTIONS = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1",
                     "LSAN_OPTIONS": f"suppressions={ROOT / 'native' / 'sanitizers' / 'opencl-drivers.supp'}"
                                     ":print_suppressions=0",
                     "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}

_builds: dict[str, NativeBuild] = {}


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str, **options) -> NativeBuild:
    if name not in _builds:
        try:
            _builds[name] = build_native(build_dir=tmp_path_factory.mktemp(name), **options)
        except NativeBuildError as err:
            if in_ci():
                pytest.fail(f"CI=true: the native runtime does not build: {err}", pytrace=False)
            pytest.skip(f"the native runtime does not build here: {err}")
    return _builds[name]


@pytest.fixture(scope="session")
def native(tmp_path_factory) -> NativeBuild:
    return build_once(tmp_path_factory, "native")


@pytest.fixture(scope="session")
def sanitized(tmp_path_factory) -> NativeBuild:
    return build_once(tmp_path_factory, "native-sanitized", sanitize=True, build_type="Debug")


@pytest.fixture(scope="session")
def environment(tmp_path_factory) -> dict[str, str]:
    """The process environment of a native run: pip's OpenCL loader and drivers."""
    return dict(os.environ, **opencl_environment(tmp_path_factory.mktemp("opencl")))


@pytest.fixture(scope="session")
def platforms() -> list[str]:
    import pyopencl as cl

    present = {p.name.strip() for p in cl.get_platforms()}
    found = [name for name in PLATFORMS if name in present]
    if not found:
        pytest.skip(f"no OpenCL device found of {', '.join(PLATFORMS)}")
    return found


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> Callable[[str], tuple[Path, Path]]:
    """``exported(model)``: (step.onnx, data.safetensors) written by `python -m torch_adreno export --data-out`."""

    files: dict[str, tuple[Path, Path]] = {}

    def export(model: str) -> tuple[Path, Path]:
        if model not in files:
            folder = tmp_path_factory.mktemp(model)
            step, data = folder / "step.onnx", folder / "data.safetensors"
            assert cli_main(["export", str(step), "--model", model, "--lr", "0.05", "--data-out", str(data),
                             "--data-steps", str(STEPS)]) == 0
            files[model] = step, data
        return files[model]

    return export


VIEW_KERNELS = {
    "k0": "__kernel void k0(__global const float* restrict in0, __global float* restrict out0) {\n"
          "  int i = get_global_id(0); out0[i] = in0[i] * 2.0f; }",
    "k1": "__kernel void k1(__global const float* restrict in1, __global float* restrict w, __global float* restrict loss) {\n"
          "  float s = 0.0f; for (int i = 0; i < 6; i++) s += in1[i]; loss[0] = s + w[0]; w[0] = w[0] + 1.0f; }",
}


def view_and_copy_step() -> onnx.ModelProto:
    """A step file made by hand: batch rows 1-2 of a [4, 3] input (a view: shape [2, 3], strides
    [3, 1], offset 3) doubled, copied to another slot, summed with the state ``w``, which each step
    increments: loss = 2 * sum(x[1:3]) + w."""
    def kernel(name: str, buffers: list[int], size: int) -> onnx.NodeProto:
        return helper.make_node(name, [], [f"{name}_out"], domain=fmt.DOMAIN, name=name, kernel_name=name,
                                opencl_source=VIEW_KERNELS[name], build_options=[""], global_size=[size],
                                local_size=[size], buffers=buffers, parameters=[""], fx_nodes=[""], graph="g",
                                index_checks=0, extensions=[""])

    copy = helper.make_node(fmt.COPY_OP, [], ["copied"], domain=fmt.DOMAIN, name="copy", destination=2, source=1,
                            nbytes=24)
    functions = [helper.make_function(fmt.DOMAIN, name, [], ["out"], [helper.make_node(
        "Constant", [], ["out"], value=onnx.numpy_helper.from_array(np.zeros(1, np.float32)))],
        [helper.make_opsetid("", fmt.OPSET)], attributes=list(attributes))
        for name, attributes in (("k0", fmt.KERNEL_ATTRIBUTES), ("k1", fmt.KERNEL_ATTRIBUTES),
                                 (fmt.COPY_OP, fmt.COPY_ATTRIBUTES))]
    graph = helper.make_graph(
        [kernel("k0", [0, 1], 6), copy, kernel("k1", [2, 3, 4], 1)], "step",
        [helper.make_tensor_value_info("batch_0", onnx.TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
        initializer=[onnx.numpy_helper.from_array(np.array([0.5], np.float32), "w")])
    model = helper.make_model(graph, functions=functions, producer_name=fmt.PRODUCER,
                              opset_imports=[helper.make_opsetid("", fmt.OPSET), helper.make_opsetid(fmt.DOMAIN, 1)])
    plan = {"identities": [
        {"index": 0, "kind": "batch", "nbytes": 24, "position": 0, "view": [[2, 3], [3, 1], 3]},
        {"index": 1, "kind": "internal", "nbytes": 24, "slot": 0},
        {"index": 2, "kind": "internal", "nbytes": 24, "slot": 1},
        {"index": 3, "kind": "persistent", "nbytes": 4, "input": "w", "shape": [1], "output": "w.new"},
        {"index": 4, "kind": "internal", "nbytes": 4, "slot": 2}],
        "slots": [24, 24, 4], "batch": [{"input": "batch_0", "position": 0, "shape": [4, 3], "dtype": "float32"}],
        "loss": {"identity": 4, "dtype": "float32", "shape": []}}
    helper.set_model_props(model, {fmt.FORMAT_KEY: str(fmt.FORMAT_VERSION), fmt.PLAN_KEY: json.dumps(plan)})
    return integrity.seal(model)


def gpt2_lora_parts(batches: int) -> tuple[torch.nn.Module, Any, torch.optim.Optimizer, list[tuple[torch.Tensor, ...]]]:
    """A one-layer GPT-2 with LoRA adapters on its attention (the base frozen), its loss, an SGD
    optimizer of the adapters and ``batches`` batches of random token ids."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    vocab, batch, sequence = 48, 2, 8
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=vocab, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = peft.get_peft_model(transformers.GPT2LMHeadModel(config), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, init_lora_weights=False))

    def loss_fn(m, x, y):
        logits = m(input_ids=x).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1))

    generator = torch.Generator().manual_seed(7)
    data = [tuple(torch.randint(0, vocab, (batch, sequence), generator=generator) for _ in range(2))
            for _ in range(batches)]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=torch.tensor(0.5))
    return model, loss_fn, optimizer, data


PARTIAL_WRITE_KERNELS = {
    "k0": "__kernel void k0(__global const float* restrict x, __global float* restrict a) {\n"
          "  int i = get_global_id(0); a[i] = x[i] * 2.0f; }",
    "k1": "__kernel void k1(__global const float* restrict a, __global float* restrict b) {\n"
          "  int i = get_global_id(0); b[i] = a[i] + 1.0f; }",
    "k2": "__kernel void k2(__global const float* restrict x, __global float* restrict c) {\n"
          "  int i = get_global_id(0); c[i] = x[i]; }",
    "k3": "__kernel void k3(__global const float* restrict c, __global const float* restrict b,\n"
          "                 __global float* restrict w, __global float* restrict loss) {\n"
          "  float s = w[0]; for (int i = 0; i < 4; i++) s += c[i] + b[i]; loss[0] = s; w[0] = w[0] + 1.0f; }",
}


def partial_write_step(fills: bool = True) -> onnx.ModelProto:
    """A step file made by hand whose last kernel reads memory no operation of the step wrote: k0
    writes ``a = 2x`` (identity 1, slot 0), k1 ``b = a + 1`` (identity 2), then k2 writes ``c = x``
    into slot 0 again (identity 1 holds a new value, as a compiled graph's slot does) for 2 of its
    4 elements only, and k3 reads all 4: loss = w + sum(c) + sum(b), each step incrementing w.
    Without fills the last two elements of ``c`` are ``a``'s stale values (a plausible, finite
    loss); with the plan's fills (``fills``: listed; False: a file exported before fills were
    listed) slot 0 is filled again before k2, and the loss is NaN."""
    sizes = {"k0": 4, "k1": 4, "k2": 2, "k3": 1}
    arguments = {"k0": [0, 1], "k1": [1, 2], "k2": [0, 1], "k3": [1, 2, 3, 4]}

    def kernel(name: str) -> onnx.NodeProto:
        return helper.make_node(name, [], [f"{name}_out"], domain=fmt.DOMAIN, name=name, kernel_name=name,
                                opencl_source=PARTIAL_WRITE_KERNELS[name], build_options=[""],
                                global_size=[sizes[name]], local_size=[sizes[name]], buffers=arguments[name],
                                parameters=[""], fx_nodes=[""], graph="g", index_checks=0, extensions=[""])

    functions = [helper.make_function(fmt.DOMAIN, name, [], ["out"], [helper.make_node(
        "Constant", [], ["out"], value=onnx.numpy_helper.from_array(np.zeros(1, np.float32)))],
        [helper.make_opsetid("", fmt.OPSET)], attributes=list(fmt.KERNEL_ATTRIBUTES)) for name in sizes]
    graph = helper.make_graph(
        [kernel(name) for name in sizes], "step",
        [helper.make_tensor_value_info("batch_0", onnx.TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
        initializer=[onnx.numpy_helper.from_array(np.array([0.5], np.float32), "w")])
    model = helper.make_model(graph, functions=functions, producer_name=fmt.PRODUCER,
                              opset_imports=[helper.make_opsetid("", fmt.OPSET), helper.make_opsetid(fmt.DOMAIN, 1)])
    plan: dict[str, Any] = {"identities": [
        {"index": 0, "kind": "batch", "nbytes": 16, "position": 0, "view": None},
        {"index": 1, "kind": "internal", "nbytes": 16, "slot": 0},
        {"index": 2, "kind": "internal", "nbytes": 16, "slot": 1},
        {"index": 3, "kind": "persistent", "nbytes": 4, "input": "w", "shape": [1], "output": "w.new"},
        {"index": 4, "kind": "internal", "nbytes": 4, "slot": 2}],
        "slots": [16, 16, 4], "batch": [{"input": "batch_0", "position": 0, "shape": [4], "dtype": "float32"}],
        "loss": {"identity": 4, "dtype": "float32", "shape": []}}
    if fills:
        plan[fmt.FILLS_KEY] = [[0, 1, 0, 16], [1, 2, 0, 16], [2, 1, 0, 16], [3, 4, 0, 4]]
    helper.set_model_props(model, {fmt.FORMAT_KEY: str(fmt.FORMAT_VERSION), fmt.PLAN_KEY: json.dumps(plan)})
    return integrity.seal(model)


def damaged_copies(step: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """Copies of an exported ``step`` damaged as storage damages files, each with the part a
    runner must name (:func:`damage_message`): 20 bytes flipped inside the data of its largest
    parameter, and 200 bytes flipped inside a kernel's OpenCL source (each copy still a valid ONNX
    model)."""
    data = step.read_bytes()
    model = onnx.load(str(step))
    parameter = max((t for t in model.graph.initializer if not t.name.startswith(("optimizer.", "lr"))),
                    key=lambda t: len(t.raw_data))
    start = data.find(parameter.raw_data)
    assert start > 0 and data.count(parameter.raw_data[:256]) == 1, parameter.name
    tensor = bytearray(data)
    for k in range(20):
        tensor[start + 64 + 13 * k] ^= 0x5A
    source = bytearray(data)
    kernel = data.find(b"__kernel")
    for k in range(200):
        source[kernel + k] ^= 0x01
    copies = {"tensor": (folder / "damaged_tensor.onnx", bytes(tensor), f"the data of initializer {parameter.name}"),
              "source": (folder / "damaged_source.onnx", bytes(source), "the kernel sources")}
    for path, content, _ in copies.values():
        path.write_bytes(content)
    return {part: (path, what) for part, (path, _, what) in copies.items()}


def damage_message(path: Path | None, what: str) -> str:
    """The pattern of a runner's message for the damaged file ``path`` (None: a file with no name,
    sent to the step server) whose ``what`` is damaged."""
    named = ".+" if path is None else r"\S*" + re.escape(path.name)
    return rf"damaged file: {named}: {re.escape(what)}: not as exported \(its SHA-256 differs"
