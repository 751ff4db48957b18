"""Work-group tuning: the candidates the kernels stage offers, verification that rejects a wrong
candidate however fast, the on-disk cache, and a tuned model against eager PyTorch."""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import capture_graphs

from torch_adreno.config import Config
from torch_adreno.fusion import fuse
from torch_adreno.kernels import launch_candidates, render_program
from torch_adreno.kernels.pointwise_reduction import GROUP_SIZE
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import plan_memory
from torch_adreno.runtime import tuning
from torch_adreno.targets import REFERENCE_PROFILE

CPU_PROFILE = dataclasses.replace(REFERENCE_PROFILE, is_gpu=False, preferred_work_group_multiple=8,
                                  max_work_group_size=4096, max_work_item_sizes=(4096, 4096, 4096))


def _net(x, w, b, v):
    # GEMMs (convolution, matmul), pointwise ops, reductions: a log-softmax over 128 features for
    # each of 2 rows (one work-group per row) and over 5 classes (one work-item per row).
    h = F.relu(F.conv2d(x, w, b, padding=1))
    return F.log_softmax(F.log_softmax(h.flatten(1), dim=1) @ v, dim=1)


def _inputs():
    return (torch.randn(2, 3, 8, 8), torch.randn(2, 3, 3, 3), torch.randn(2), torch.randn(128, 5))


def _programs(profile, inputs=None):
    inputs = inputs or _inputs()
    graphs = capture_graphs(_net, *[t.requires_grad_() for t in inputs])
    programs = []
    for i, gm in enumerate(graphs):
        graph = lower_graph(gm, Config(), f"net_{i}", None)
        fused = fuse(graph, Config())
        programs.append((graph, render_program(fused, plan_memory(fused, profile), profile)))
    return programs


def _defines(kernel):
    return dict(o[2:].partition("=")[::2] for o in kernel.build_options if o.startswith("-D"))


@pytest.mark.parametrize("profile", [REFERENCE_PROFILE, CPU_PROFILE], ids=["gpu", "cpu"])
def test_candidates_are_valid_launches_of_the_same_source(profile):
    kinds = set()
    for _, program in _programs(profile):
        for kernel in program.kernels:
            candidates = launch_candidates(kernel, profile)
            assert candidates[0] is kernel, "the heuristic's launch comes first"
            assert len({(c.build_options, c.global_size, c.local_size) for c in candidates}) == len(candidates)
            for c in candidates:
                assert c.source == kernel.source and c.params == kernel.params
                assert all(g % loc == 0 for g, loc in zip(c.global_size, c.local_size, strict=True))
                assert math.prod(c.local_size) <= profile.max_work_group_size
                assert all(loc <= m for loc, m in zip(c.local_size, profile.max_work_item_sizes, strict=False))
                defines = _defines(c)
                if GROUP_SIZE in defines:
                    kinds.add("tree")
                    assert int(defines[GROUP_SIZE]) == c.local_size[0]
                    assert c.global_size[0] // c.local_size[0] == kernel.global_size[0] // kernel.local_size[0]
                elif "TILE_M" in defines:
                    kinds.add("tiled")
                    assert c.local_size[:2] == (int(defines["TILE_N"]) // int(defines["WPT_N"]),
                                                int(defines["TILE_M"]) // int(defines["WPT_M"]))
                    tiles_n = math.ceil(int(defines["SIZE_N"]) / int(defines["TILE_N"]))
                    assert c.global_size[0] == tiles_n * c.local_size[0]
                    # (operand helpers written for the heuristic's K step take no other)
                    if defines["K_GRANULE"] != "1":
                        assert defines["TILE_K"] == defines["K_GRANULE"]
                elif kernel.kind == "gemm":
                    kinds.add("direct")
                    assert c.global_size[2] == kernel.global_size[2] and c.local_size[1:] == (1, 1)
                else:
                    kinds.add("linear")
                    assert c.global_size[0] >= kernel.global_size[0] - kernel.local_size[0] + 1
                    assert c.local_size[0] % profile.preferred_work_group_multiple == 0
            if len(candidates) > 1:
                kinds.add("tunable")
    assert {"tree", "linear", "tunable", "tiled" if profile.is_gpu else "direct"} <= kinds


# --- on the device -------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_ADRENO_CACHE", str(tmp_path))
    # Storing program binaries costs PoCL a second compile of each candidate program; tuning is
    # what is tested here, and it builds only in this process.
    monkeypatch.setenv("TORCH_ADRENO_BINARY_CACHE", "0")
    return tmp_path


@pytest.fixture
def runtime():
    from torch_adreno.runtime import get_runtime

    return get_runtime(None)


def _pointwise_program(runtime):
    """A graph of one pointwise kernel over 4096 elements."""
    gm = capture_graphs(lambda x: torch.sigmoid(x) * 3.0 + 1.0, torch.randn(64, 64))[0]
    graph = lower_graph(gm, Config(), "pw_0", 1)
    fused = fuse(graph, Config())
    return render_program(fused, plan_memory(fused, runtime.profile), runtime.profile)


def _pointwise(runtime):
    program = _pointwise_program(runtime)
    (kernel,) = program.kernels
    return program.graph, kernel


@pytest.mark.device
def test_wrong_candidate_is_rejected_even_if_fastest(runtime, cache, monkeypatch, caplog):
    graph, kernel = _pointwise(runtime)
    # Half the work-items: half the output is never written. The fastest launch, and wrong, as a
    # driver that mishandles a work-group shape would be.
    wrong = dataclasses.replace(kernel, global_size=(kernel.global_size[0] // 2,))
    offered = tuning.launch_candidates

    def with_wrong(k, profile, choices=None):
        return [*offered(k, profile, choices), wrong]

    real_time = tuning.time_candidates

    def fastest_if_wrong(rt, scratch, launches):
        seconds = real_time(rt, scratch, launches)
        return [1e-9 if candidate == wrong else t for (candidate, _), t in zip(launches, seconds, strict=True)]

    monkeypatch.setattr(tuning, "launch_candidates", with_wrong)
    monkeypatch.setattr(tuning, "time_candidates", fastest_if_wrong)
    with caplog.at_level(logging.WARNING, logger=tuning.__name__):
        result = tuning.tune_kernels(runtime, graph, [kernel], progress=False)[kernel.name]
    assert result.chosen != wrong
    (rejection,) = [r for r in result.rejected if r.wrong_result]
    assert rejection.candidate == tuning.describe(wrong, kernel)
    assert "differs from the default launch's at 2048 of 4096 elements" in rejection.reason
    assert rejection.candidate not in result.timings, "a rejected candidate is never timed"
    assert any("rejected" in r.message and rejection.candidate in r.message for r in caplog.records)
    entry = json.loads((tuning.device_cache_dir(runtime) / f"{result.key}.json").read_text())
    assert {"candidate": rejection.candidate, "reason": rejection.reason, "wrong_result": True} in entry["rejected"]


@pytest.mark.device
def test_choice_is_cached_per_device_and_kernel_and_not_timed_again(runtime, cache, monkeypatch):
    graph, kernel = _pointwise(runtime)
    first = tuning.tune_kernels(runtime, graph, [kernel], progress=False)[kernel.name]
    assert not first.cached and len(first.timings) == len(launch_candidates(kernel, runtime.profile))
    path = tuning.device_cache_dir(runtime) / f"{first.key}.json"
    assert path.parent.parent == cache / "tuning"
    entry = json.loads(path.read_text())
    assert entry["device"] == runtime.profile.key and entry["kernel"] == kernel.name
    assert entry["choice"] == [list(first.chosen.build_options), list(first.chosen.global_size),
                               list(first.chosen.local_size)]

    def no_device_work(*args, **kwargs):
        raise AssertionError("a cached choice is not timed or launched again")

    monkeypatch.setattr(tuning, "time_candidates", no_device_work)
    monkeypatch.setattr(tuning, "_launch", no_device_work)
    monkeypatch.setattr(tuning, "build_kernels", no_device_work)
    # The same kernel in another graph (another name and symbol) is the same cache entry.
    renamed = dataclasses.replace(kernel, name="other_0_pw", symbol="other_0_pw")
    assert renamed.source != kernel.source
    again = tuning.tune_kernels(runtime, graph, [renamed], progress=False)["other_0_pw"]
    assert again.cached and again.key == first.key
    assert again.chosen.local_size == first.chosen.local_size
    assert again.chosen.global_size == first.chosen.global_size


@pytest.mark.device
def test_unreadable_cache_entry_is_tuned_again(runtime, cache, caplog):
    graph, kernel = _pointwise(runtime)
    first = tuning.tune_kernels(runtime, graph, [kernel], progress=False)[kernel.name]
    path = tuning.device_cache_dir(runtime) / f"{first.key}.json"
    path.write_text('{"device": 1}')
    with caplog.at_level(logging.WARNING, logger=tuning.__name__):
        again = tuning.tune_kernels(runtime, graph, [kernel], progress=False)[kernel.name]
    assert not again.cached and "malformed" in caplog.text
    assert json.loads(path.read_text())["device"] == runtime.profile.key


@pytest.mark.device
def test_executable_launches_the_heuristic_unless_tuned(runtime, cache):
    from torch_adreno.runtime import Executable, get_residency

    program = _pointwise_program(runtime)
    x = torch.randn(64, 64)
    plain = Executable(program, runtime, get_residency(runtime))
    assert plain.tuning == {} and plain._steps[0].source is program.kernels[0]
    assert not (cache / "tuning").exists()
    tuned = Executable(program, runtime, get_residency(runtime), tune=True)
    (result,) = tuned.tuning.values()
    assert tuned._steps[0].source == result.chosen
    expected = torch.sigmoid(x) * 3.0 + 1.0
    torch.testing.assert_close(plain([x])[0], expected)
    torch.testing.assert_close(tuned([x])[0], expected)


@pytest.mark.device
def test_every_offered_candidate_computes_the_default_result(runtime, cache):
    """Every launch the kernels stage offers for the local-memory GEMM template and a tree reduction
    computes the default's result (rendered for a GPU-like profile; PoCL runs them too). The direct
    GEMM template's launches are checked the same way by the model test, pointwise ones by the
    rejection test."""
    gpu_like = dataclasses.replace(runtime.profile, is_gpu=True)
    graph, program = _programs(gpu_like)[0]
    results = tuning.tune_kernels(runtime, graph, program.kernels, progress=False)
    tuned = {name for name, r in results.items() if len(r.timings) > 1}
    assert {k.name for k in program.kernels if k.kind == "gemm" or "-DGROUP_SIZE=128" in k.build_options} <= tuned
    for r in results.values():
        assert not [x for x in r.rejected if x.wrong_result], r.rejected


@pytest.mark.device
def test_tuned_model_matches_eager(cache):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="adreno", options={"tune": True}, dynamic=False)
    out = compiled(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    entries = [json.loads(p.read_text()) for p in (cache / "tuning").glob("*/*.json")]
    assert entries, "options={'tune': True} tuned the kernels (backend.compile_graph passes config.tune)"
    assert any(e["kernel"].startswith("backward_") for e in entries)
    for e in entries:
        assert not [r for r in e["rejected"] if r["wrong_result"]], e


def test_tune_option_and_environment_variable():
    assert Config.from_options({}).tune is False
    assert Config.from_options({"tune": True}).tune is True
    assert Config.from_options({}, environ={"TORCH_ADRENO_TUNE": "1"}).tune is True
    assert Config.from_options({"tune": False}, environ={"TORCH_ADRENO_TUNE": "1"}).tune is False
    with pytest.raises(ValueError, match="TORCH_ADRENO_TUNE"):
        Config.from_options({}, environ={"TORCH_ADRENO_TUNE": "fast"})
