"""Two OpenCL compilers in CI. The suite runs on one CPU implementation (see
``conftest.py``: PoCL where its compiler builds, else Intel's runtime); this test runs a bounded,
named subset on the other one, where it builds, in a subprocess. Different OpenCL compilers
catch different undefined behaviour in generated kernels (an uninitialised register, a read past
a buffer, a missing barrier) that one of them happens to tolerate.

The subset (:data:`SUBSET`) is what a second compiler builds differently, each kernel family
once: training and replay of LeNet with both optimizers (linear and convolution layers, SGD's and
Adam's updates), the transformer's training (attention, embedding and its scatter-add backward,
GELU, LayerNorm), the GEMM and convolution templates, pooling, reductions, normalisations and half
precision. Left to the suite's own runtime: the MLP's runs (LeNet's kernels include its linear
layers) and resnet_mini's (its convolutions, BatchNorm and pooling are the templates' and
test_var_std_layer_norm_batch_norm's here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_adreno.runtime.device import list_devices

#: The subset's tests: each kernel family once on the second compiler.
SUBSET = (
    "tests/training/test_training.py::test_trains_like_eager[sgd-lenet]",
    "tests/training/test_training.py::test_trains_like_eager[adam-lenet]",
    "tests/training/test_training.py::test_bigger_reference_models_train_like_eager[transformer]",
    "tests/replay/test_replay.py::test_reference_models_replay_bit_identically[lenet]",
    "tests/replay/test_replay.py::test_replay_is_bit_identical_to_the_compiled_graphs",
    *(f"tests/lowering/test_ops.py::{name}" for name in (
        "test_mm_transposes", "test_bmm", "test_addmm_alpha_beta", "test_conv2d", "test_conv1d", "test_sum_mean",
        "test_log_softmax_and_cross_entropy", "test_both_gemm_templates_on_this_device",
        "test_split_k_gemms_match_eager", "test_both_gemm_templates_for_convolution",
        "test_var_std_layer_norm_batch_norm")),
    "tests/lowering/test_ops_pool_conv.py",
    "tests/lowering/test_half.py",
)
ROOT = Path(__file__).resolve().parents[2]


def _implementation(label: str) -> str:
    return label.split(":", 1)[0].strip()


@pytest.mark.device
def test_the_named_subset_passes_on_the_second_cpu_compiler() -> None:
    from torch_adreno.runtime import get_runtime

    suite = get_runtime(None).entry
    others = [e for e in list_devices() if e.unusable is None and _implementation(e.label) != _implementation(suite.label)
              and not e.device.type & 4]  # 4: CL_DEVICE_TYPE_GPU (a GPU is not a CPU compiler)
    if not others:
        unusable = [f"{e.label} ({e.unusable})" for e in list_devices() if e.unusable]
        pytest.skip(f"only one OpenCL compiler builds kernels here ({suite.label}); unusable: {unusable or 'none'}")
    other = others[0]
    env = {**os.environ, "TORCH_ADRENO_DEVICE": other.label}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *SUBSET]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    assert done.returncode == 0, f"the subset on {other.label} failed:\n{tail}"
    assert " passed" in tail, tail
