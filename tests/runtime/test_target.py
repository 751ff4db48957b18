"""Adreno target profiles and compiling for a target on the present device.

Stage tests need no device; the device tests compile every reference model for a target on
PoCL (or whatever device is selected) and check each kernel against the target's limits, and
train the reference models for ``adreno740`` against eager.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import record_programs

from torch_adreno.config import Config
from torch_adreno.errors import DeviceMemoryError
from torch_adreno.frontend import pipeline
from torch_adreno.kernels.gemm import choose_tiling, tiling_candidates
from torch_adreno.kernels.workgroup import linear_local_size, reduction_local_size
from torch_adreno.memory import StorageKind, check_allocation
from torch_adreno.models import MODELS
from torch_adreno.targets import REFERENCE_PROFILE
from torch_adreno.targets.profiles import (
    SOURCES,
    TARGETS,
    AdrenoTarget,
    compile_profile,
    derive_target,
    get_target,
    match_device,
    profile_for,
    target_of_device,
)

REQUIRED = ("adreno640", "adreno650", "adreno660", "adreno730", "adreno740", "adreno750", "adreno830")

#: A desktop-class device with wider limits than any Adreno (a data-center NVIDIA GPU through OpenCL, roughly).
DESKTOP = dataclasses.replace(
    REFERENCE_PROFILE, name="desktop", compute_units=132, max_work_group_size=1024,
    max_work_item_sizes=(1024, 1024, 64), preferred_work_group_multiple=32, local_mem_bytes=48 * 1024,
    global_mem_bytes=140 << 30, max_alloc_bytes=35 << 30, max_parameter_bytes=4352, unified_memory=False)


# -- profiles -------------------------------------------------------------------------------------


def test_every_required_adreno_has_a_profile_with_a_source_for_every_value():
    assert set(REQUIRED) <= set(TARGETS)
    cited = [f.name for f in dataclasses.fields(AdrenoTarget) if f.name not in ("name", "sources")]
    for target in TARGETS.values():
        for name in cited:
            source = target.sources.get(name)
            assert source, f"{target.name}.{name} has no source"
            assert source.startswith("estimate:") or source.split()[0] in SOURCES, (target.name, name, source)
            assert "estimate" in source or any(key in source for key in SOURCES), (target.name, name, source)


def test_profiles_hold_the_public_adreno_facts():
    for target in TARGETS.values():
        assert target.local_mem_bytes == 32 * 1024
        assert target.image2d_max == (16384, 16384) and target.image_from_buffer_max_pixels == 2**27
        assert target.unified_memory and target.fp16
        assert "cl_qcom_recordable_queues" in target.extensions and "cl_khr_command_buffer" not in target.extensions
        assert target.peak_fp16_gflops >= target.peak_fp32_gflops > 0 and target.bandwidth_gbs > 0
        assert ("cl_qcom_large_buffer" in target.extensions) == (target.generation >= 7)
        assert target.wave_sizes == ((64,) if target.generation >= 8 else (64, 128))
    assert TARGETS["adreno750"].max_alloc_bytes == 1 << 30


@pytest.mark.parametrize(("strings", "expected"), [
    (("QUALCOMM Adreno(TM) 750", "OpenCL 3.0 Adreno(TM) 750"), "adreno750"),
    (("QUALCOMM Adreno(TM)", "OpenCL 2.0 Adreno(TM) 640"), "adreno640"),  # older drivers: number in the version
    (("QUALCOMM Adreno(TM) 740",), "adreno740"),
    (("Adreno (TM) 830",), "adreno830"),
    (("QUALCOMM Adreno(TM) 505", "OpenCL 2.0 Adreno(TM) 505"), None),  # an Adreno without a profile
    (("NVIDIA GeForce RTX 4090", "OpenCL 3.0 CUDA"), None),
    (("cpu-haswell-Intel(R) Xeon(R)", "OpenCL 3.0 PoCL"), None),
])
def test_a_real_device_is_matched_to_its_profile_by_name_and_version(strings, expected):
    found = match_device(*strings)
    assert (found.name if found else None) == expected


def test_unknown_target_is_a_value_error_listing_the_valid_ones():
    with pytest.raises(ValueError, match="adreno999") as err:
        Config.from_options({"target": "adreno999"})
    for name in REQUIRED:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="TORCH_ADRENO_TARGET"):
        Config.from_options(environ={"TORCH_ADRENO_TARGET": "mali"})
    assert Config.from_options(environ={"TORCH_ADRENO_TARGET": "Adreno740"}).target == TARGETS["adreno740"]
    assert Config.from_options({"target": "adreno640"}, environ={"TORCH_ADRENO_TARGET": "adreno740"}).target == TARGETS["adreno640"]
    assert Config.from_options().target is None


def test_a_derived_profile_is_a_target_without_joining_the_named_ones():
    phone = derive_target("adreno740", "my_phone", "its clinfo", max_alloc_bytes=256 << 20)
    config = Config.from_options({"target": phone})
    assert config.target is phone and "my_phone" not in TARGETS
    assert profile_for(REFERENCE_PROFILE, config.target).max_alloc_bytes == 256 << 20


# -- the compile profile --------------------------------------------------------------------------


@pytest.mark.parametrize("device", [DESKTOP, REFERENCE_PROFILE], ids=["desktop", "small"])
@pytest.mark.parametrize("name", REQUIRED)
def test_compile_profile_obeys_both_devices_and_takes_the_targets_preferences(device, name):
    target = get_target(name)
    profile = compile_profile(device, target)
    assert profile.target == name
    assert profile.max_work_group_size == min(device.max_work_group_size, target.max_work_group_size)
    assert all(a <= min(b, c) for a, b, c in zip(profile.max_work_item_sizes, device.max_work_item_sizes,
                                                  target.max_work_item_sizes, strict=False))
    assert profile.local_mem_bytes == min(device.local_mem_bytes, target.local_mem_bytes)
    assert profile.max_alloc_bytes == min(device.max_alloc_bytes, target.max_alloc_bytes)
    assert profile.max_parameter_bytes <= target.max_parameter_bytes
    assert profile.preferred_work_group_multiple == target.wave_sizes[0]
    assert profile.compute_units == target.compute_units and profile.is_gpu
    assert profile.unified_memory == device.unified_memory  # the present device's runtime fact
    assert profile.key == device.key  # binary caches stay the device's (the sources differ anyway)
    assert compile_profile(device, None) is device


def test_on_the_target_gpu_itself_the_drivers_compute_units_are_kept():
    real = dataclasses.replace(REFERENCE_PROFILE, name="QUALCOMM Adreno(TM) 740", compute_units=5,
                               opencl_version="OpenCL 3.0 Adreno(TM) 740", max_work_group_size=1024)
    assert compile_profile(real, get_target("adreno740")).compute_units == 5
    assert compile_profile(real, get_target("adreno640")).compute_units == get_target("adreno640").compute_units


@pytest.mark.parametrize("name", REQUIRED)
def test_gemm_tiles_and_group_sizes_fit_every_target(name):
    profile = compile_profile(DESKTOP, get_target(name))
    for m, n, batch in [(32, 16, 1), (128, 256, 1), (784, 256, 1), (4096, 4096, 1), (64, 64, 16), (1, 10, 1)]:
        tilings = [choose_tiling(m, n, batch, profile), *tiling_candidates(m, n, batch, profile)]
        for tiling in tilings:
            assert tiling.local_bytes() <= profile.local_mem_bytes, (m, n, tiling)
            threads = (tiling.tile_m // tiling.wpt_m) * (tiling.tile_n // tiling.wpt_n)
            assert threads <= profile.max_work_group_size
    for items in (1, 100, 10_000, 10**7):
        assert linear_local_size(items, profile) % profile.preferred_work_group_multiple == 0
        assert linear_local_size(items, profile) <= profile.max_work_group_size
    assert reduction_local_size(10**6, profile) <= profile.max_work_group_size
    # The desktop's wide tiles (for 132 compute units) are not what a 6-unit Adreno gets.
    assert choose_tiling(4096, 4096, 1, profile).tile_m < 128


def test_a_buffer_above_the_targets_largest_allocation_is_refused_naming_it_and_the_limit():
    from torch_adreno import ir

    graph = ir.Graph("forward_0")
    graph.buffers["addmm"] = ir.Buffer("addmm", (40_000, 8_000), ir.DType.F32)  # 1.28 GB
    graph.buffers["x"] = ir.Buffer("x", (40_000, 8_000), ir.DType.F32)
    profile = compile_profile(DESKTOP, get_target("adreno740"))
    with pytest.raises(DeviceMemoryError, match=r"addmm .*1280000000 bytes.*target adreno740 \(1073741824 bytes"):
        check_allocation(graph, "addmm", StorageKind.ARENA, profile)
    with pytest.raises(DeviceMemoryError, match=r"input buffer x"):
        check_allocation(graph, "x", StorageKind.INPUT, profile)
    check_allocation(graph, "addmm", StorageKind.ARENA, DESKTOP)  # fits the desktop itself
    check_allocation(graph, "x", StorageKind.INPUT, DESKTOP)


# -- on the device --------------------------------------------------------------------------------


def _compiled_programs(monkeypatch, model_name: str, target: str) -> list:
    """Compile one training step of a reference model for ``target`` (cache off, so that every graph
    is compiled here) and return its kernel programs."""
    programs = record_programs(monkeypatch)
    spec = MODELS[model_name]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))
    compiled = torch.compile(model, backend="adreno", options={"target": target, "compile_cache": False})
    F.cross_entropy(compiled(x), y).backward()
    assert len(programs) >= 2, "forward and backward were not compiled here"
    return programs


def _local_defines(kernel) -> dict[str, str]:
    return dict(o[2:].partition("=")[::2] for o in kernel.build_options if o.startswith("-D"))


FAST_MODELS = ["mlp", "lenet"]
SLOW_MODELS = ["resnet_mini", "transformer", "mobilenet_mini", "lstm"]


@pytest.mark.device
@pytest.mark.parametrize("model_name", [*FAST_MODELS, *(pytest.param(m, marks=pytest.mark.slow) for m in SLOW_MODELS)])
def test_every_kernel_of_every_reference_model_fits_adreno740(monkeypatch, model_name):
    import pyopencl as cl

    from torch_adreno.runtime import get_runtime
    from torch_adreno.runtime.build import build_kernels

    target = get_target("adreno740")
    runtime = get_runtime(None)
    programs = _compiled_programs(monkeypatch, model_name, target.name)
    for program in programs:
        assert program.profile is not None and program.profile.target == target.name
        built = build_kernels(runtime, program.kernels)
        for kernel in program.kernels:
            where = f"{model_name}: {kernel.name} local={kernel.local_size}"
            assert math.prod(kernel.local_size) <= target.max_work_group_size, where
            assert all(s <= m for s, m in zip(kernel.local_size, target.max_work_item_sizes, strict=False)), where
            assert all(g % s == 0 for g, s in zip(kernel.global_size, kernel.local_size, strict=True)), where
            # What the compiled kernel really takes from local memory, as the driver reports it.
            local_bytes = built[kernel.name].get_work_group_info(cl.kernel_work_group_info.LOCAL_MEM_SIZE,
                                                                 runtime.device)
            assert local_bytes <= target.local_mem_bytes, f"{where}: {local_bytes} bytes of local memory"
            if kernel.kind == "gemm" and "TILE_M" in _local_defines(kernel):
                assert kernel.local_size[0] * kernel.local_size[1] % target.wave_sizes[0] == 0, where
        plan = program.plan
        assert all(size <= target.max_alloc_bytes for size in plan.arena_bytes)
        assert all(a.nbytes <= target.max_alloc_bytes for a in plan.allocations.values())


@pytest.mark.device
def test_the_target_changes_the_code_and_is_part_of_the_compile_cache_key(monkeypatch):
    from torch_adreno.frontend.compile_cache import cache_salt

    salts = {cache_salt(Config.from_options({"target": t})) for t in (None, "adreno640", "adreno740")}
    assert len(salts) == 3
    tiled = [k for p in _compiled_programs(monkeypatch, "mlp", "adreno640") for k in p.kernels if k.kind == "gemm"]
    # PoCL itself gets the direct GEMM template; for an Adreno the local-memory tiles.
    assert tiled and all("TILE_M" in _local_defines(k) for k in tiled)
    assert all(re.search(r"//   from FX node", k.source) for k in tiled)


@pytest.mark.device
@pytest.mark.parametrize("test_name", [
    "test_trains_like_eager[adam-mlp]", "test_trains_like_eager[sgd-lenet]",
    pytest.param("test_bigger_reference_models_train_like_eager[resnet_mini]", marks=pytest.mark.slow),
    pytest.param("test_bigger_reference_models_train_like_eager[transformer]", marks=pytest.mark.slow),
    pytest.param("test_mobilenet_and_lstm_train_like_eager[mobilenet_mini]", marks=pytest.mark.slow),
    pytest.param("test_mobilenet_and_lstm_train_like_eager[lstm]", marks=pytest.mark.slow),
])
def test_reference_models_train_like_eager_compiled_for_adreno740(monkeypatch, test_name):
    """The reference-model training tests of test_training.py, run with TORCH_ADRENO_TARGET=adreno740
    (what `TORCH_ADRENO_TARGET=adreno740 pytest tests/training/test_training.py` does for all of them).

    The larger models run 4 steps instead of 20 here: compiled for an Adreno, their GEMMs are
    local-memory tiles, which PoCL runs about 70x slower than its own direct template (0.3 against
    20 GFLOP/s for the MLP's first GEMM, measured), and CI's time is bounded. The 20-step runs: the command above."""
    import test_training


    monkeypatch.setenv("TORCH_ADRENO_TARGET", "adreno740")
    monkeypatch.setenv("TORCH_ADRENO_COMPILE_CACHE", "0")  # every graph compiled here, for the target
    targets = []
    image_operands = []
    compile_program = pipeline.compile_program

    def record(gm, config, *args, **kwargs):
        program = compile_program(gm, config, *args, **kwargs)
        targets.append(program.profile.target if program.profile else "")
        image_operands.extend(o for k in program.kernels for o in k.images)
        return program

    monkeypatch.setattr(pipeline, "compile_program", record)
    function, _, params = test_name.partition("[")
    values = params.rstrip("]").split("-")
    test = getattr(test_training, function)
    if function != "test_trains_like_eager":
        monkeypatch.setattr(test_training, "STEPS", 4)
    if function == "test_trains_like_eager":
        test(model_name=values[1], opt_name=values[0])
    else:
        test(model_name=values[0])
    assert targets and set(targets) == {"adreno740"}
    # The target prefers images (images="auto"): the GEMMs and convolutions read operands through them.
    assert image_operands, "no kernel compiled for the target reads an image"


@pytest.mark.device
def test_tuning_for_a_target_tries_only_launches_within_it(tmp_path, monkeypatch):
    """A program compiled for a target carries its profile, and the tuner varies launches only
    inside it (PoCL alone accepts groups up to 4096 and multiples of 8), under a key of its own."""
    from helpers import capture_graphs

    from torch_adreno.fusion import fuse
    from torch_adreno.kernels import launch_candidates, render_program
    from torch_adreno.lowering import lower_graph
    from torch_adreno.memory import plan_memory
    from torch_adreno.runtime import Executable, get_residency, get_runtime, tuning

    monkeypatch.setenv("TORCH_ADRENO_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCH_ADRENO_BINARY_CACHE", "0")
    runtime = get_runtime(None)
    target = get_target("adreno740")
    profile = compile_profile(runtime.profile, target)
    x = torch.randn(64, 64)
    gm = capture_graphs(lambda t: torch.sigmoid(t) * 3.0 + 1.0, x)[0]
    fused = fuse(lower_graph(gm, Config(), "pw_0", 1), Config())
    program = render_program(fused, plan_memory(fused, profile), profile)
    assert program.profile is profile
    (kernel,) = program.kernels
    candidates = launch_candidates(kernel, profile)
    assert len(candidates) > 1
    for candidate in candidates:
        (local,) = candidate.local_size
        assert local % target.wave_sizes[0] == 0 and local <= target.max_work_group_size, candidate.local_size
    assert tuning.kernel_key(kernel, target.name) != tuning.kernel_key(kernel)
    executable = Executable(program, runtime, get_residency(runtime), tune=True)
    (result,) = executable.tuning.values()
    assert result.key == tuning.kernel_key(kernel, target.name)
    assert set(result.timings) <= {tuning.describe(c, kernel) for c in candidates}
    torch.testing.assert_close(executable([x])[0], torch.sigmoid(x) * 3.0 + 1.0)


@pytest.mark.device
def test_a_graph_compiled_for_one_target_is_not_served_for_another(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    from torch_adreno.frontend import compile_cache

    if not compile_cache.AVAILABLE:
        pytest.skip("this torch has no bundled AOTAutograd cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCH_ADRENO_COMPILE_CACHE", raising=False)
    monkeypatch.delenv("TORCH_ADRENO_TARGET", raising=False)
    x = torch.randn(8, 16)
    weight = torch.randn(16, 8, requires_grad=True)

    def run(target):
        torch._dynamo.reset()
        before = dict(counters["aot_autograd"])
        out = torch.compile(lambda a, w: torch.relu(a @ w), backend="adreno", options={"target": target},
                            dynamic=False)(x, weight)
        out.sum().backward()
        torch.testing.assert_close(out, torch.relu(x @ weight))
        return counters["aot_autograd"]["autograd_cache_hit"] - before.get("autograd_cache_hit", 0)

    assert run("adreno740") == 0
    assert run("adreno640") == 0  # another target: another program, a miss
    assert run(None) == 0
    assert run("adreno740") == 1  # positive control: the first one again hits


def test_a_remote_cpu_device_is_planned_as_a_cpu_and_a_remote_gpu_as_a_gpu():
    """A remote device's target keeps its device type: a CPU's step gets the CPU code paths (GPU
    tiles on a CPU device ran its LeNet step 4x slower), a GPU's the GPU ones."""
    cpu = dataclasses.replace(REFERENCE_PROFILE, is_gpu=False, name="a CPU")
    for device in (cpu, REFERENCE_PROFILE):
        target = target_of_device(f"remote {device.name}", device)
        assert compile_profile(cpu, target).is_gpu is device.is_gpu
        assert target.sources["is_gpu"].startswith("reported by the device's driver")
