"""MkDocs hook: the parts of the site written from the code and the results files at build time.

- ``<!-- generated: options -->``: the table of every backend option, from
  ``torch_adreno.config.OPTIONS`` (its name, environment variable, default and description);
- ``<!-- generated: results NAME -->``: a table of :data:`TABLES` made from the JSON lines under
  ``benchmarks/results/<device>/``, with the command that reproduces it and the date, device,
  driver and torch of the records it shows;
- on the API reference, Sphinx roles (``:class:`` ...) left by docstrings are dropped.

A marker this hook does not know, or a results file it cannot read, fails the build.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"<!-- generated: (\w+)(?: ([\w-]+))? -->")


def _config_module() -> types.ModuleType:
    """``torch_adreno.config`` without running the package's ``__init__`` (which loads OpenCL and
    the whole compiler): the module needs only its own siblings."""
    if "torch_adreno" in sys.modules:
        return importlib.import_module("torch_adreno.config")
    before = set(sys.modules)
    package = types.ModuleType("torch_adreno")
    package.__path__ = [str(ROOT / "torch_adreno")]
    sys.modules["torch_adreno"] = package
    try:
        return importlib.import_module("torch_adreno.config")
    finally:
        for name in set(sys.modules) - before:
            if name == "torch_adreno" or name.startswith("torch_adreno."):
                del sys.modules[name]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def options_table() -> str:
    rows = ["| option | environment variable | default | what it does |", "| --- | --- | --- | --- |"]
    for spec in _config_module().OPTIONS.values():
        env = f"`{spec.env}`" if spec.env else ""
        rows.append(f"| `{spec.name}` | {env} | `{spec.default!r}` | {_cell(spec.doc)} |")
    return "\n".join(rows)


# ---- results tables ------------------------------------------------------------------------------

def _records(path: str) -> list[dict[str, Any]]:
    file = RESULTS / path
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def _last(records: Iterable[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The last record per value of ``keys`` (files are appended to: the last is the newest)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in records:
        out[tuple(r.get(k) for k in keys)] = r
    return out


def _f(value: Any, spec: str = ".2f") -> str:
    return "" if value is None else format(value, spec)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _provenance(command: str, files: list[str], records: list[dict[str, Any]]) -> str:
    def values(key: str) -> str:
        return ", ".join(sorted({str(r[key]) for r in records if r.get(key) is not None})) or "not recorded"

    return (f"\n\nReproduce: `{command}`. Results: {', '.join(f'`benchmarks/results/{f}`' for f in files)}; "
            f"measured {values('date')} on {values('device')} ({values('platform')}, driver {values('driver')}), "
            f"torch {values('torch')}.")


def _joules(record: dict[str, Any] | None) -> str:
    """A peer's joules per step, or "not measured" with the date of the record that has none."""
    if record is None:
        return ""
    if record.get("energy_j_per_step") is not None:
        return _f(record["energy_j_per_step"], ".3f")
    return f"not measured ({record.get('date', 'undated')})"


def h200_workloads() -> str:
    files = ["h200/workloads.jsonl", "h200/eager_profile.jsonl"]
    by = _last(_records(files[0]), "workload", "peer")
    eager_device = {r["workload"]: r["cuda_us"] / 1e3 for r in _records(files[1])}
    rows, shown = [], []
    for workload, title in (("resnet18", "ResNet-18, 224², batch 16"), ("mobilenet_v2", "MobileNetV2, 224², batch 16"),
                            ("gpt2_lora", "GPT-2 124M, LoRA r=8, seq 256, batch 4")):
        eager, inductor, ours = (by.get((workload, p)) for p in ("eager", "inductor_cg", "ours"))
        shown += [r for r in (eager, inductor, ours) if r]
        inductor_cell = _f(inductor and inductor["median_ms"])
        if inductor and ours and inductor["date"] != ours["date"]:
            inductor_cell += f" ({inductor['date']})"
        rows.append([title, _f(eager and eager["median_ms"]), _f(eager_device.get(workload)), inductor_cell,
                     f"**{_f(ours['median_ms'])}** ({_f(ours['device_ms'])})" if ours else "",
                     _f(ours and eager and ours["median_ms"] / eager["median_ms"]) + "x", str(ours and ours["launches"]),
                     " / ".join(_joules(r) for r in (eager, inductor, ours))])
    return _table(["workload", "eager CUDA", "eager's CUDA kernels", "inductor + CUDA graphs",
                   "ours, replayed (device)", "ours / eager", "launches",
                   "J per step: eager / inductor + CUDA graphs / ours"], rows) + _provenance(
        "python benchmarks/workloads.py --device NVIDIA --workloads resnet18 mobilenet_v2 gpt2_lora; "
        "python benchmarks/eager_profile.py --workloads resnet18 mobilenet_v2 gpt2_lora", files, shown)


def h200_reference_models() -> str:
    file = "h200/peers.jsonl"
    records = _records(file)
    by = _last(records, "model", "variant")
    rows = []
    for model in ("mlp", "lenet", "resnet_mini", "transformer"):
        ours = by.get((model, "adreno TrainingStep replayed"))
        cells = [_f(by[(model, v)]["median_ms"]) if (model, v) in by else ""
                 for v in ("eager CUDA", "inductor CUDA", "adreno")]
        rows.append([model, *cells, f"**{_f(ours and ours['median_ms'])}**", _f(ours and ours["device_time_ms"]),
                     str(ours and ours["kernel_launches"])])
    return _table(["model", "eager CUDA", "inductor CUDA", "ours, compiled loop", "ours, TrainingStep replayed",
                   "its device time", "launches"], rows) + _provenance(
        "python benchmarks/peers.py --device NVIDIA --steps 30", [file], records)


def h200_sgemm() -> str:
    file = "h200/gemm.jsonl"
    records = [r for r in _records(file) if r.get("kind") == "sgemm"]
    # The file holds runs with and without --tune: the tuned figure comes from the last run that had it.
    tuned = _last((r for r in records if r.get("adreno_tuned_gflops") is not None), "shape")
    rows = [[r["shape"].split("x")[0], _f(r.get("adreno_gflops"), ",.0f"),
             _f(tuned[(r["shape"],)]["adreno_tuned_gflops"] if (r["shape"],) in tuned else None, ",.0f"),
             _f(r.get("clblast_gflops"), ",.0f"), _f(r.get("torch_gflops"), ",.0f")]
            for r in _last(records, "shape").values()]
    return _table(["n (n x n x n)", "ours, heuristic", "ours, tune=True", "CLBlast", "cuBLAS (torch.mm, CUDA)"],
                  rows) + " \n\nGFLOP/s, device time." + _provenance(
        "python benchmarks/gemm.py --tune --device NVIDIA", [file], records)


def h200_attention() -> str:
    file = "h200/attention.jsonl"
    records = _records(file)
    rows = []
    for (seq, path), r in _last(records, "seq", "path").items():
        rows.append([str(seq), path, _f(r["forward_device_ms"], ".3f"), _f(r["backward_device_ms"], ".3f"),
                     _f(r["forward_kernel_mb"] + r["backward_kernel_mb"], ",.0f")])
    return _table(["seq", "attention", "forward ms", "backward ms", "kernel MB (both)"], rows) + (
        "\n\nBatch 4, 12 heads, head dimension 64, causal, float32.") + _provenance(
        "python benchmarks/attention.py --device NVIDIA", [file], records)


def pocl_reference_models() -> str:
    files = ["pocl/replay.jsonl", "pocl/fusion.jsonl"]
    replay = _last(_records(files[0]), "model")
    fusion = _last(_records(files[1]), "model", "variant")
    rows = []
    for model, r in replay.items():
        unfused, fused = fusion.get((model[0], "unfused")), fusion.get((model[0], "fused"))
        launches = f"{fused['kernel_launches']} (unfused {unfused['kernel_launches']})" if fused and unfused else ""
        rows.append([model[0], str(r["launches"]), _f(r["full_ms"]), f"**{_f(r['replay_ms'])}**", launches])
    shown = list(replay.values()) + list(fusion.values())
    return _table(["model", "launches per step", "TrainingStep, compiled graphs (ms)", "replayed (ms)",
                   "launches of the compiled loop, fused"], rows) + _provenance(
        "python benchmarks/replay.py --device Portable; python benchmarks/fusion.py --device Portable",
        files, shown)


def pocl_compile_time() -> str:
    file = "pocl/compile_time.jsonl"
    records = _records(file)
    by = _last(records, "model", "phase")
    rows = [[model, *(_f(by[(model, phase)]["compile_s"]) if (model, phase) in by else ""
                      for phase in ("cold", "warm", "warm_no_compile_cache"))]
            for model in dict.fromkeys(r["model"] for r in records)]
    return _table(["model", "cold (s)", "warm, all caches (s)", "warm, compile cache off (s)"], rows) + (
        "\n\nSeconds to compile forward and backward (first step minus a steady step), each phase a fresh "
        "process.") + _provenance("python benchmarks/compile_time.py --device Portable", [file], records)


def intel_training_loops() -> str:
    file = "intel-cpu/training_loops.jsonl"
    records = _records(file)
    rows = []
    for r in records:
        if r["study"] == "first_calls":
            rows.append(["first calls", "compile / capture / first replay",
                         f"{_f(r['compile_s'], '.1f')} s / {_f(r['capture_s'], '.2f')} s / {_f(r['replay_s'], '.3f')} s"])
        elif r["study"] == "schedule":
            rows.append(["cosine schedule", f"lr as {r['schedule']}" if r["schedule"] != "none" else "no schedule",
                         f"{r['replayed']} of {r['steps']} replayed, {_f(r['median_replayed_ms'])} ms per step"])
        elif r["study"] == "lengths":
            rows.append(["six lengths", "Buckets (3 lengths)" if r["bucketed"] else "as they come",
                         f"{r['replayed']} of {r['steps']} replayed, {_f(r['total_s'], '.1f')} s in all"])
    return _table(["study", "variant", "result"], rows) + _provenance(
        "python benchmarks/training_loops.py --device Intel", [file], records)


def intel_native_half() -> str:
    file = "intel-cpu/native_half.jsonl"
    records = _records(file)
    by = _last(records, "model", "native_half")
    rows = []
    for model in dict.fromkeys(r["model"] for r in records):
        off, on = by.get((model, False)), by.get((model, True))
        if off and on:
            rows.append([model, _f(off["median_step_ms"], ".1f"), _f(on["median_step_ms"], ".1f"),
                         _f(on["loss_distance_from_float64"], ".1e"), _f(on["eager_float16_distance_from_float64"], ".1e")])
    return _table(["model (float16)", "step ms, default", "step ms, native_half", "loss distance from float64",
                   "eager float16's"], rows) + _provenance(
        "python benchmarks/native_half.py --device Intel --models mlp lenet transformer", [file], records)


def intel_module_db() -> str:
    file = "intel-cpu/module_db.jsonl"
    head = _records(file)[0]
    counts = head["counts"]
    row = [str(counts.get(k, "")) for k in ("pass", "refused", "shared", "wrong", "crash")]
    return _table(["pass", "refused with our error", "fail alike under aot_eager", "wrong", "crash"], [row]) + (
        f"\n\nReproduce: `{head['command']}`. Results: `benchmarks/results/{file}`; measured {head['date']} "
        f"on {head['device']}.")


def intel_native_step() -> str:
    file = "intel-cpu/native_step.jsonl"
    records = list(_last(_records(file), "model").values())
    rows = [[r["model"], _f(r["replay_ms"], ".1f"), _f(r["python_runner_ms"], ".1f"), _f(r["native_ms"], ".1f"),
             _f(r["native_over_replay"], ".3f")] for r in records]
    return _table(["model", "replay ms", "Python runner ms", "native ms", "native / replay, per round"], rows) + (
        _provenance("python benchmarks/native_step.py", [file], records))


def intel_remote_step() -> str:
    file = "intel-cpu/remote_step.jsonl"
    records = list(_last(_records(file), "model").values())
    rows = [[r["model"], _f(r["replay_ms"], ".1f"), _f(r["remote_ms"], ".1f"),
             _f(r.get("training_step_remote_ms"), ".1f"), _f(r["budget_ms"], ".1f")] for r in records]
    return _table(["model", "local replay ms", "remote step ms (client)", "remote TrainingStep ms",
                   "bound: 1.1 x replay + batch at 1 GB/s"], rows) + _provenance(
        "python benchmarks/remote_step.py", [file], records)


TABLES: dict[str, Callable[[], str]] = {
    "h200-workloads": h200_workloads, "h200-reference-models": h200_reference_models, "h200-sgemm": h200_sgemm,
    "h200-attention": h200_attention, "pocl-reference-models": pocl_reference_models,
    "pocl-compile-time": pocl_compile_time, "intel-cpu-training-loops": intel_training_loops,
    "intel-cpu-native-half": intel_native_half, "intel-cpu-module-db": intel_module_db,
    "intel-cpu-native-step": intel_native_step, "intel-cpu-remote-step": intel_remote_step,
}


def _generate(match: re.Match[str]) -> str:
    kind, name = match.group(1), match.group(2)
    if kind == "options" and name is None:
        return options_table()
    if kind == "results" and name in TABLES:
        return TABLES[name]()
    raise ValueError(f"unknown generated block {match.group(0)!r} (known: options, results {', '.join(TABLES)})")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return MARKER.sub(_generate, markdown)


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri.startswith("reference/"):
        html = re.sub(r":(?:class|attr|mod|func|meth|data|exc|obj):(?=<code>)", "", html)
    return html
